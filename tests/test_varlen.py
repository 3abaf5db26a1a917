"""flash_attn_varlen_func against a loop over sequences through the float64 oracle.

Both backends: the reference (per-sequence tiled algorithm) and the Triton kernels
(in the interpreter on a CPU machine, on the GPU in the ``gpu`` tests).
"""

from __future__ import annotations

import pytest
import torch

import flashtile
from flashtile.testing import assert_close_to_oracle, max_error

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def _cu(lengths, device=DEVICE):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def check_varlen(lens_q, lens_k, heads_q, heads_kv, headdim, dtype=torch.float32, pad=3, device=DEVICE,
                 dropout_p=0.0, alibi=False, **options):
    """Packed call vs per-sequence oracle; ``pad`` extra rows past the last sequence."""
    total_q, total_k = sum(lens_q) + pad, sum(lens_k) + pad
    q = torch.randn(total_q, heads_q, headdim, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(total_k, heads_kv, headdim, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(total_k, heads_kv, headdim, dtype=dtype, device=device, requires_grad=True)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    slopes = torch.rand(len(lens_q), heads_q, device=device) if alibi else None
    torch.manual_seed(1234)  # the call draws its dropout seed from this generator state
    seed = int(torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64).item())
    torch.manual_seed(1234)
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), dropout_p=dropout_p,
                                                   alibi_slopes=slopes, return_attn_probs=True, **options)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    mask = None
    if dropout_p > 0:  # sequence b draws the counters of batch entry b
        mask = flashtile.dropout_keep_mask(seed, dropout_p, len(lens_q), heads_q, max(lens_q), max(lens_k),
                                           device=device)

    def per_sequence(upcast):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        outs, lses = [], []
        for b, (q0, q1, k0, k1) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(),
                                                  cu_k[1:].tolist())):
            if q1 == q0:
                continue
            if k1 == k0:  # no keys: zero output, LSE -inf
                outs.append(torch.zeros(q1 - q0, heads_q, headdim, dtype=torch.float64 if upcast else dtype,
                                        device=device) + 0 * leaves[0][q0:q1].sum())
                lses.append(torch.full((heads_q, q1 - q0), float("-inf"), device=device, dtype=torch.float64))
                continue
            o, seq_lse = flashtile.naive_attention(
                leaves[0][None, q0:q1], leaves[1][None, k0:k1], leaves[2][None, k0:k1], upcast=upcast,
                return_lse=True, alibi_slopes=slopes[b] if alibi else None, dropout_p=dropout_p,
                dropout_mask=None if mask is None else mask[b:b + 1, :, :q1 - q0, :k1 - k0], **options)
            outs.append(o[0])
            lses.append(seq_lse[0].double())
        o = torch.cat(outs + [torch.zeros(pad, heads_q, headdim, dtype=outs[0].dtype, device=device)])
        packed_lse = torch.cat(lses + [torch.full((heads_q, pad), float("-inf"), device=device, dtype=torch.float64)],
                               dim=1)
        g = torch.autograd.grad(o, leaves, dout.to(o.dtype), allow_unused=True)
        g = [torch.zeros_like(t) if gi is None else gi for gi, t in zip(g, leaves)]
        return o, packed_lse, g

    ref_out, ref_lse, ref_grads = per_sequence(True)
    pt_out, pt_lse, pt_grads = per_sequence(False)
    assert lse.shape == (heads_q, total_q) and lse.dtype == torch.float32
    assert_close_to_oracle("out", out, ref_out, pt_out)
    assert max_error(lse, ref_lse) <= 2 * max_error(pt_lse, ref_lse) + 1e-4, "lse"
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_close_to_oracle(name, g, r, p, grad=True)
    # Padding rows past the last sequence: zero output and zero gradients, never garbage.
    # (Sliced from the start: ``t[-pad:]`` with pad = 0 would be the whole tensor.)
    assert torch.all(out[total_q - pad:] == 0) and torch.all(grads[0][total_q - pad:] == 0)
    assert torch.all(grads[1][total_k - pad:] == 0) and torch.all(grads[2][total_k - pad:] == 0)


CASES = [
    # lens_q, lens_k, heads_q, heads_kv, headdim, options
    ([5, 17, 1], [5, 17, 1], 2, 2, 16, {"causal": True}),
    ([3, 0, 20], [7, 4, 0], 2, 1, 32, {}),  # zero-length sequences on either side
    ([9, 30], [30, 9], 4, 2, 40, {"causal": True}),  # q ≠ k lengths, bottom-right causal per sequence
    ([12, 25], [12, 25], 2, 2, 16, {"window_size": (4, 2), "softcap": 3.0, "alibi": True}),
    ([18, 7], [11, 19], 2, 1, 16, {"dropout_p": 0.3, "causal": True}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[0]}k{c[1]}h{c[2]}:{c[3]}d{c[4]}{c[5]}")
def test_varlen_matches_per_sequence_oracle(backend, case):
    lens_q, lens_k, hq, hkv, d, options = case
    check_varlen(lens_q, lens_k, hq, hkv, d, **options)


def test_varlen_float16_on_the_kernels(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    check_varlen([13, 1, 22], [13, 1, 22], 2, 2, 32, dtype=torch.float16, causal=True)


def test_varlen_equals_dense_when_lengths_are_equal(backend):
    q, k, v = (torch.randn(3, 21, 2, 16, device=DEVICE) for _ in range(3))
    dense = flashtile.flash_attn_func(q, k, v, causal=True)
    cu = _cu([21, 21, 21])
    packed = flashtile.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 21, 21,
                                              causal=True)
    assert max_error(packed, dense.flatten(0, 1)) < 1e-5


def test_strided_cu_seqlens(backend):
    # The kernels read offset i at cu_seqlens + i: a view with stride 2 gave the wrong
    # sequences (a 4.1 max error on the Triton path) before the API made it contiguous.
    q, k, v = (torch.randn(40, 2, 16, device=DEVICE) for _ in range(3))
    cu = _cu([5, 35])
    strided = torch.stack([cu, torch.zeros_like(cu)], -1)[:, 0]
    assert strided.stride(0) == 2
    got = flashtile.flash_attn_varlen_func(q, k, v, strided, strided, 35, 35, causal=True)
    expected = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 35, 35, causal=True)
    assert torch.equal(got, expected)


def test_packed_varlen_faces():
    qkv = torch.randn(30, 3, 2, 16, requires_grad=True)
    cu = _cu([10, 20], "cpu")
    a = flashtile.flash_attn_varlen_qkvpacked_func(qkv, cu, 20, causal=True)
    b = flashtile.flash_attn_varlen_kvpacked_func(qkv[:, 0], qkv[:, 1:], cu, cu, 20, 20, causal=True)
    c = flashtile.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, 20, 20, causal=True)
    assert torch.equal(a, c) and torch.equal(b, c)
    a.sum().backward()
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()


@pytest.mark.parametrize("mutate,error,match", [
    (lambda cu: cu.long(), TypeError, r"^cu_seqlens_q: expected dtype torch.int32"),
    (lambda cu: cu.flip(0), ValueError, r"^cu_seqlens_q: expected non-decreasing"),
    (lambda cu: cu * 10, ValueError, r"^cu_seqlens_q: expected non-decreasing offsets .* ending <= 30"),
    (lambda cu: cu[:1], ValueError, r"^cu_seqlens_q: expected a 1-d tensor"),
    (lambda cu: cu.float(), TypeError, r"^cu_seqlens_q: expected dtype torch.int32"),
    (lambda cu: cu.tolist(), TypeError, r"^cu_seqlens_q: expected an int32 torch.Tensor"),
])
def test_bad_cu_seqlens(mutate, error, match):
    q = torch.randn(30, 2, 16)
    cu = _cu([10, 20], "cpu")
    with pytest.raises(error, match=match):
        flashtile.flash_attn_varlen_func(q, q, q, mutate(cu), cu, 20, 20)


def test_bad_varlen_arguments():
    q = torch.randn(30, 2, 16)
    cu = _cu([10, 20], "cpu")
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected 3 offsets"):
        flashtile.flash_attn_varlen_func(q, q, q, cu, _cu([30], "cpu"), 20, 30)
    with pytest.raises(ValueError, match=r"^max_seqlen_q: expected an int >= 0"):
        flashtile.flash_attn_varlen_func(q, q, q, cu, cu, -1, 20)
    with pytest.raises(ValueError, match=r"^q: expected a 3-d tensor"):
        flashtile.flash_attn_varlen_func(q[None], q, q, cu, cu, 20, 20)
    with pytest.raises(ValueError, match=r"^k: heads_q \(2\) must be a multiple of heads_kv \(3\)"):
        flashtile.flash_attn_varlen_func(q, torch.randn(30, 3, 16), torch.randn(30, 3, 16), cu, cu, 20, 20)
    with pytest.raises(ValueError, match=r"^qkv: expected shape \(total, 3, heads, headdim\)"):
        flashtile.flash_attn_varlen_qkvpacked_func(torch.randn(30, 2, 2, 16), cu, 20)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("headdim", [64, 128])
def test_gpu_varlen(dtype, headdim, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    lens_q = [1, 700, 0, 1500, 333]
    lens_k = [9, 700, 64, 1200, 1024]
    check_varlen(lens_q, lens_k, 8, 2, headdim, dtype=dtype, pad=5, causal=True)
    check_varlen(lens_q, lens_k, 8, 8, headdim, dtype=dtype, pad=0, window_size=(128, 16))


def test_first_sequence_may_start_past_row_0(backend):
    # cu_seqlens[0] > 0: the rows before it belong to no sequence (flash-attn allows it).
    q, k, v = (torch.randn(30, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    cu = torch.tensor([11, 30], dtype=torch.int32, device=DEVICE)
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 19, 19, causal=True, return_attn_probs=True)
    out[11:].sum().backward()
    # The rows before the first sequence: zero output and gradients, the LSE of no key.
    assert torch.all(out[:11] == 0) and torch.all(lse[:, :11] == float("-inf"))
    assert all(torch.all(t.grad[:11] == 0) for t in (q, k, v))
    leaves = [t[11:].detach()[None].requires_grad_() for t in (q, k, v)]
    expected = flashtile.naive_attention(*leaves, causal=True)
    expected.sum().backward()
    assert max_error(out[11:], expected[0]) < 1e-5
    for got, leaf in zip((q.grad, k.grad, v.grad), leaves):
        assert max_error(got[11:], leaf.grad[0]) < 1e-5


@pytest.mark.gpu
@pytest.mark.large_memory
def test_gpu_varlen_offsets_beyond_2_31_elements(monkeypatch):
    # One short sequence at row 600000 of (rows, 32, 128) tensors: its first element lies at
    # 600000 × 4096 > 2³¹, so only 64-bit offsets reach it (cu_seqlens[0] > 0 spares the
    # attention over the rows before it).
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    start, length = 600_000, 100
    q, k, v = (torch.randn(start + length, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    assert start * q.stride(0) > 2**31
    cu = torch.tensor([start, start + length], dtype=torch.int32, device="cuda")
    out = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, length, length, causal=True)
    dout = torch.randn(length, 32, 128, device="cuda", dtype=torch.bfloat16)
    out[start:].backward(dout)
    leaves = [t[start:].detach().double()[None].requires_grad_() for t in (q, k, v)]
    expected = flashtile.naive_attention(*leaves, causal=True)
    expected.backward(dout.double()[None])
    assert max_error(out[start:], expected[0]) < 2e-2
    for got, leaf in zip((q.grad, k.grad, v.grad), leaves):
        assert max_error(got[start:], leaf.grad[0]) < 5e-2


def test_padding_fill_writes_exactly_the_rows_outside_every_sequence():
    # The Triton path allocates outputs uninitialised and writes only the padding rows.
    from flashtile.kernels.padding import fill_rows_outside

    cu = torch.tensor([4, 9, 9, 17], dtype=torch.int32, device=DEVICE)
    x = torch.full((23, 5), float("nan"), device=DEVICE)
    fill_rows_outside(x, cu, 0.0)
    assert torch.all(x[:4] == 0) and torch.all(x[17:] == 0) and torch.all(x[4:17].isnan())
    lse = torch.full((3, 23), float("nan"), device=DEVICE)  # rows are its columns
    fill_rows_outside(lse.t(), cu, float("-inf"))
    assert torch.all(lse[:, :4] == float("-inf")) and torch.all(lse[:, 17:] == float("-inf"))
    assert torch.all(lse[:, 4:17].isnan())
    no_padding = torch.full((23, 5), float("nan"), device=DEVICE)
    fill_rows_outside(no_padding, torch.tensor([0, 23], dtype=torch.int32, device=DEVICE), 0.0)
    assert torch.all(no_padding.isnan())
