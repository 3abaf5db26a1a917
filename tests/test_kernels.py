"""The Triton kernels against the float64 oracle.

On a CPU machine the kernels run in Triton's interpreter (conftest sets
TRITON_INTERPRET=1): few, small shapes, float32 and float16 only (the interpreter
cannot do bfloat16 arithmetic). The ``gpu`` tests run the full grid on a CUDA GPU.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import flashtile
from flashtile.testing import assert_close_to_oracle, max_error

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")


def _make(shape_bshd, dtype, layout, device, bhsd_as_view=True):
    """Random tensor of logical shape (B, S, H, D) in the given layout, with varied strides."""
    b, s, h, d = shape_bshd
    if layout == "bshd":
        t = torch.randn(b, s, h, d, dtype=dtype, device=device)
    elif bhsd_as_view:  # a transposed view of a bshd buffer: non-trivial strides
        t = torch.randn(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)
    else:
        t = torch.randn(b, h, s, d, dtype=dtype, device=device)
    return t.requires_grad_()


def check_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, dtype, *, causal=False, window=(-1, -1),
               softcap=0.0, alibi=False, layout="bshd", device=DEVICE, bhsd_as_view=True):
    q = _make((batch, seqlen_q, heads_q, headdim), dtype, layout, device, bhsd_as_view)
    k = _make((batch, seqlen_k, heads_kv, headdim), dtype, layout, device, bhsd_as_view)
    v = _make((batch, seqlen_k, heads_kv, headdim), dtype, layout, device, bhsd_as_view)
    slopes = torch.rand(batch, heads_q, device=device) if alibi else None
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes, layout=layout)

    out, lse = flashtile.attention(q, k, v, return_lse=True, **options)
    dout = torch.randn_like(out)
    if layout == "bhsd":  # a non-contiguous upstream gradient
        dout = torch.randn(out.shape[0], out.shape[2], out.shape[1], out.shape[3], dtype=dtype,
                           device=device).transpose(1, 2)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    def reference(upcast):
        q_, k_, v_ = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o, o_lse = flashtile.naive_attention(q_, k_, v_, upcast=upcast, return_lse=True, **options)
        g = torch.autograd.grad(o, (q_, k_, v_), dout.to(o.dtype))
        return o, o_lse, g

    ref_out, ref_lse, ref_grads = reference(upcast=True)
    pt_out, pt_lse, pt_grads = reference(upcast=False)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (batch, heads_q, seqlen_q) and lse.dtype == torch.float32
    assert_close_to_oracle("out", out, ref_out, pt_out)
    # The LSE is float32 in both; PyTorch's float16 LSE error is tiny, so allow float32 rounding.
    assert max_error(lse, ref_lse) <= 2 * max_error(pt_lse, ref_lse) + 1e-4, "lse"
    for name, g, rg, pg in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_close_to_oracle(name, g, rg, pg, grad=True)


# -- CPU: the same kernels in Triton's interpreter (few and small: each launch costs seconds)
INTERPRETER_CASES = [
    # batch, sq, sk, hq, hkv, d, options
    (1, 1, 1, 1, 1, 16, {}),
    (1, 9, 9, 1, 1, 1, {"causal": True}),  # head dims below 16 are padded to the 16 tl.dot needs
    (1, 20, 12, 2, 2, 8, {}),
    (2, 17, 17, 2, 2, 40, {"causal": True}),
    (1, 113, 17, 2, 1, 32, {"causal": True}),
    (1, 17, 113, 4, 2, 64, {"causal": True, "layout": "bhsd"}),
    (1, 40, 40, 2, 2, 80, {"window": (7, 3)}),
    (1, 33, 50, 2, 2, 16, {"softcap": 5.0, "alibi": True}),
    (1, 37, 20, 2, 1, 96, {"causal": True, "window": (4, -1), "layout": "bhsd"}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", INTERPRETER_CASES, ids=lambda c: f"b{c[0]}q{c[1]}k{c[2]}h{c[3]}:{c[4]}d{c[5]}{c[6]}")
def test_kernels_small(case, dtype):
    batch, sq, sk, hq, hkv, d, options = case
    check_case(batch, sq, sk, hq, hkv, d, dtype, **options)


def test_fully_masked_rows_are_zero_not_nan():
    # seqlen_q > seqlen_k with causal: the first rows see no key at all.
    q = torch.randn(1, 20, 2, 32, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 5, 2, 32, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 5, 2, 32, device=DEVICE, requires_grad=True)
    out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    out.sum().backward()
    assert torch.all(out[:, :15] == 0) and torch.all(lse[:, :, :15] == float("-inf"))
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.all(q.grad[:, :15] == 0)
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_flash_attn_faces_on_the_kernels():
    qkv = torch.randn(2, 19, 3, 2, 32, device=DEVICE, requires_grad=True)
    out, lse, probs = flashtile.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 2, 19)
    out.sum().backward()
    q2, k2, v2 = (qkv[:, :, i].detach().double().requires_grad_() for i in range(3))
    ref = flashtile.naive_attention(q2, k2, v2, causal=True)
    ref.sum().backward()
    assert max_error(out, ref) < 1e-5
    assert max_error(qkv.grad, torch.stack([q2.grad, k2.grad, v2.grad], dim=2)) < 1e-4


def test_lse_gradient_flows():
    q, k, v = (torch.randn(1, 24, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    w = torch.randn_like(lse)
    grads = torch.autograd.grad((lse * w).sum() + out.sum(), (q, k, v))
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o2, l2 = flashtile.naive_attention(q2, k2, v2, causal=True, return_lse=True)
    ref = torch.autograd.grad((l2 * w.double()).sum() + o2.sum(), (q2, k2, v2))
    for g, r in zip(grads, ref):
        assert max_error(g, r) < 1e-4


# -- GPU: the full grid on the H200
GPU_HEADDIMS = [32, 40, 64, 80, 96, 128, 192, 256]
GPU_SEQLENS = [(1, 1), (17, 17), (113, 113), (203, 203), (1023, 1023), (1024, 1024), (2048, 2048), (4097, 4097),
               (113, 203), (203, 113), (1, 1023), (1023, 17), (4097, 1024)]
GPU_GRID = [
    (dtype, d, sq_sk, causal)
    for dtype, d, sq_sk, causal in itertools.product([torch.bfloat16, torch.float16], GPU_HEADDIMS, GPU_SEQLENS,
                                                     [False, True])
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", GPU_GRID,
                         ids=[f"{str(g[0])[6:]}-d{g[1]}-q{g[2][0]}k{g[2][1]}-{'causal' if g[3] else 'full'}"
                              for g in GPU_GRID])
def test_gpu_grid(dtype, headdim, seqlens, causal):
    sq, sk = seqlens
    # Rotate GQA ratio and layout through the grid so every combination appears.
    index = GPU_GRID.index((dtype, headdim, seqlens, causal))
    heads_q, heads_kv = [(8, 1), (8, 2), (4, 4)][index % 3]
    layout = ["bshd", "bhsd"][(index // 3) % 2]
    batch = 2 if sq * sk <= 1024 * 1024 else 1
    check_case(batch, sq, sk, heads_q, heads_kv, headdim, dtype, causal=causal, layout=layout,
               bhsd_as_view=index % 4 < 2)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"window": (256, 0)}, {"window": (100, 37)}, {"softcap": 30.0},
                                     {"alibi": True, "causal": True}, {"causal": True, "window": (64, -1)}],
                         ids=str)
@pytest.mark.parametrize("headdim", [64, 128])
def test_gpu_variants(options, headdim):
    check_case(2, 1500, 1337, 8, 2, headdim, torch.bfloat16, **options)


@pytest.mark.gpu
def test_gpu_float32_full_precision_and_tf32(monkeypatch):
    check_case(2, 203, 300, 4, 2, 64, torch.float32, causal=True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    q, k, v = (torch.randn(1, 512, 4, 64, device="cuda") for _ in range(3))
    out = flashtile.attention(q, k, v)
    ref = flashtile.naive_attention(q, k, v)
    assert max_error(out, ref) < 5e-3  # tf32 operands: ~1e-3 relative


@pytest.mark.gpu
def test_gpu_backward_is_deterministic():
    # deterministic=True: the same bits on every call whatever path the backward takes (on sm_90
    # with Triton 3.8+ the fused Gluon backward, which adds dQ in no fixed order, is skipped).
    q, k, v = (torch.randn(8, 2048, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flashtile.attention(q, k, v, causal=True, deterministic=True)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(100):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_many_batch_heads_beyond_grid_limit():
    # batch × heads = 70000 > 65535: the 1-D grid has no such limit.
    q, k, v = (torch.randn(35000, 16, 2, 32, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    out = flashtile.attention(q, k, v, causal=True)
    out.backward(torch.ones_like(out))
    tail = slice(-3, None)
    q2, k2, v2 = (t[tail].detach().double().requires_grad_() for t in (q, k, v))
    ref = flashtile.naive_attention(q2, k2, v2, causal=True)
    ref.backward(torch.ones_like(ref))
    assert max_error(out[tail], ref) < 2e-3
    assert max_error(q.grad[tail], q2.grad) < 2e-2 and max_error(v.grad[tail], v2.grad) < 2e-2


@pytest.mark.gpu
@pytest.mark.large_memory
def test_gpu_tensors_beyond_2_31_elements():
    # 66000 × 256 × 1 × 128 > 2³¹ elements: the last batches live past every 32-bit offset.
    batch = 66000
    q, k, v = (torch.randn(batch, 256, 1, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    assert q.numel() > 2**31
    out = flashtile.attention(q, k, v)
    dout = torch.randn_like(out)
    out.backward(dout)
    tail = slice(-2, None)
    q2, k2, v2 = (t[tail].detach().double().requires_grad_() for t in (q, k, v))
    ref = flashtile.naive_attention(q2, k2, v2)
    ref.backward(dout[tail].double())
    assert max_error(out[tail], ref) < 2e-2
    for g, r in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        assert max_error(g[tail], r) < 5e-2


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph_inductor():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64, device="cuda", dtype=torch.bfloat16)

        def forward(self, q, k, v):
            return self.proj(flashtile.attention(q, k, v, causal=True))

    torch._dynamo.reset()
    model = Block()
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    eager = model(q, k, v)
    eager_grads = torch.autograd.grad(eager.float().square().sum(), (q, k, v))
    compiled = torch.compile(model, fullgraph=True)(q, k, v)  # fullgraph: any graph break raises
    compiled_grads = torch.autograd.grad(compiled.float().square().sum(), (q, k, v))
    assert max_error(compiled, eager) < 2e-2  # bf16 linear layers may fuse differently
    for a, b in zip(compiled_grads, eager_grads):
        assert max_error(a, b) < 5e-2 * max(1.0, float(b.abs().max()))
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_opcheck():
    # No grad: the op's gradient lives outside it (ops._AttentionFunction).
    q, k, v = (torch.randn(2, 77, 4, 40, device="cuda", dtype=torch.float16) for _ in range(3))
    args = (q, k, v, "bshd", 0.2, None, 0, 0.0, None, "triton", False, None, 0.0, None, None, None, 0, 0, None)
    result = torch.library.opcheck(torch.ops.flashtile.attention_forward.default, args)
    failed = {test: status for test, status in result.items() if status != "SUCCESS"}
    assert not failed, f"opcheck failed: {failed}"


@pytest.mark.gpu
def test_gpu_autotune_writes_cache_and_stays_correct(monkeypatch, tmp_path):
    # The Gluon kernels have no tuning: both off, so that the Triton forward and backward tune
    # (the Gluon backward runs d64 under auto since session 10, and the backward's entries
    # went missing from the table).
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    monkeypatch.setenv("FLASHTILE_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHTILE_CACHE_DIR", str(tmp_path))
    check_case(1, 700, 900, 4, 2, 64, torch.bfloat16, causal=True)
    files = list(tmp_path.glob("autotune-*.json"))
    assert len(files) == 1, f"expected one cache file per GPU, got {files}"
    table = json.loads(files[0].read_text())
    assert {key.split("-")[0] for key in table} == {"fwd", "dkdv", "dq"}, table


@pytest.mark.gpu
def test_gpu_large_magnitude_inputs_do_not_overflow():
    # Scores of size ~1e4·sqrt(d): the running max keeps exp2 in range; no inf, no NaN.
    q, k, v = (100 * torch.randn(2, 333, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_()
    check_case_tensors = (q, k, v)
    out = flashtile.attention(*check_case_tensors, causal=True)
    out.backward(torch.randn_like(out))
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in check_case_tensors)
    ref = flashtile.naive_attention(*(t.detach() for t in check_case_tensors), causal=True)
    pt = flashtile.naive_attention(*(t.detach() for t in check_case_tensors), causal=True, upcast=False)
    assert_close_to_oracle("out", out, ref, pt)
