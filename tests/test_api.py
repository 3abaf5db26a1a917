"""The public faces: flash-attn 2.x compatibility, layouts, scale, backend choice,
torch.compile and the custom-op contract (opcheck)."""

import inspect
import math
import subprocess
import sys

import pytest
import torch

import flashtile
from flashtile import attention, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashtile.backends import BackendStatus, backend_status, select_backend
from flashtile.testing import max_error

from helpers import check_against_oracle, make_qkv, random_slopes

CPU = torch.device("cpu")

# ---------------------------------------------------------------------------
# flash-attn 2.x signatures: a user swaps one import.

FLASH_ATTN_OPTIONS = [
    ("dropout_p", 0.0),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("softcap", 0.0),
    ("alibi_slopes", None),
    ("deterministic", False),
    ("return_attn_probs", False),
]


@pytest.mark.parametrize("fn, leading", [
    (flash_attn_func, ["q", "k", "v"]),
    (flash_attn_qkvpacked_func, ["qkv"]),
    (flash_attn_kvpacked_func, ["q", "kv"]),
], ids=lambda x: getattr(x, "__name__", "-".join(x) if isinstance(x, list) else x))
def test_flash_attn_signatures(fn, leading):
    params = list(inspect.signature(fn).parameters.values())
    names = [p.name for p in params]
    assert names == leading + [n for n, _ in FLASH_ATTN_OPTIONS], f"{fn.__name__}: argument order {names}"
    for p in params[: len(leading)]:
        assert p.default is inspect.Parameter.empty, f"{fn.__name__}: {p.name} must be required"
    for p, (name, default) in zip(params[len(leading):], FLASH_ATTN_OPTIONS):
        assert p.default == default, f"{fn.__name__}: {name} defaults to {p.default!r}, flash-attn uses {default!r}"
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{fn.__name__}: {name} must be positional too"


def test_public_names():
    for name in ("attention", "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                 "naive_attention", "backend_status", "__version__", "merge_attention_states",
                 "merge_attention_states_pair", "dropout_keep_mask"):
        assert hasattr(flashtile, name), f"flashtile.{name} is missing"
        assert name in flashtile.__all__, f"{name} missing from flashtile.__all__"


def test_import_queries_no_gpu_and_imports_no_triton():
    code = "import sys, flashtile; sys.exit(('triton' in sys.modules) * 3)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 3, "import flashtile imported triton (kernels must load on first use)"
    assert result.returncode == 0, f"import flashtile failed:\n{result.stderr}"


# ---------------------------------------------------------------------------
# Return values.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_return_attn_probs_gives_out_lse_none(dtype):
    q, k, v = make_qkv(2, 17, 23, 4, 2, 32, dtype=dtype, requires_grad=False)
    result = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 3, "return_attn_probs=True must give (out, lse, None)"
    out, lse, probs = result
    assert probs is None, "the probabilities are never materialised"
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (2, 4, 17), f"lse must be (batch, heads, seqlen_q), got {tuple(lse.shape)}"
    assert lse.dtype == torch.float32, f"lse must be float32, got {lse.dtype}"
    expected_out, expected_lse = flashtile.naive_attention(q, k, v, causal=True, return_lse=True)
    assert max_error(lse, expected_lse) < 1e-5, "lse must be the natural-log LSE of the scores"
    plain = flash_attn_func(q, k, v, causal=True)
    assert isinstance(plain, torch.Tensor), "return_attn_probs=False must give the output tensor alone"
    assert torch.equal(plain, out)


def test_attention_returns_out_or_out_lse():
    q, k, v = make_qkv(1, 9, 9, 2, 2, 16, requires_grad=False)
    out = attention(q, k, v)
    assert isinstance(out, torch.Tensor)
    out2, lse = attention(q, k, v, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (1, 2, 9)


# ---------------------------------------------------------------------------
# Packed faces share the unpacked core and give gradients to the packed tensor.


def test_qkvpacked_matches_unpacked():
    qkv = torch.randn(2, 37, 3, 4, 32, requires_grad=True)
    slopes = random_slopes(4)
    kwargs = dict(causal=True, window_size=(8, 0), softcap=3.0, alibi_slopes=slopes)
    out = flash_attn_qkvpacked_func(qkv, **kwargs)
    dout = torch.randn_like(out)
    out.backward(dout)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    expected = flash_attn_func(q, k, v, **kwargs)
    expected.backward(dout)
    assert torch.equal(out, expected), "qkvpacked output differs from flash_attn_func"
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2)), "qkvpacked gradient differs"
    assert qkv.grad.abs().max() > 0


def test_kvpacked_matches_unpacked_with_gqa():
    q = torch.randn(2, 19, 4, 32, requires_grad=True)
    kv = torch.randn(2, 29, 2, 2, 32, requires_grad=True)
    out, lse, _ = flash_attn_kvpacked_func(q, kv, causal=True, return_attn_probs=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q2 = q.detach().clone().requires_grad_()
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    expected, expected_lse, _ = flash_attn_func(q2, k, v, causal=True, return_attn_probs=True)
    expected.backward(dout)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse), "kvpacked differs from flash_attn_func"
    assert torch.equal(q.grad, q2.grad)
    assert torch.equal(kv.grad, torch.stack([k.grad, v.grad], dim=2)), "kvpacked gradient differs"


def test_flash_attn_func_against_oracle():
    q, k, v = make_qkv(2, 41, 67, 4, 2, 64, dtype=torch.float16)
    slopes = random_slopes(2, 4)
    options = dict(causal=True, window_size=(20, 3), softcap=2.0, alibi_slopes=slopes, softmax_scale=0.2)

    def fn(q, k, v):
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **options)
        return out, lse

    check_against_oracle(fn, q, k, v, **options)


@pytest.mark.parametrize("window_size", [[4, 0], (4, 0)], ids=["list", "tuple"])
def test_window_size_as_list_or_tuple(window_size):
    q, k, v = make_qkv(1, 20, 20, 2, 2, 16, requires_grad=False)
    out = flash_attn_func(q, k, v, window_size=window_size)
    expected = flashtile.naive_attention(q, k, v, window_size=(4, 0))
    assert max_error(out, expected) < 1e-5


def test_deterministic_backward():
    q, k, v = make_qkv(1, 70, 90, 4, 1, 32)
    dout = torch.randn(q.shape)
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        flash_attn_func(q, k, v, causal=True, deterministic=True).backward(dout)
        grads.append([t.grad.clone() for t in (q, k, v)])
    for name, a, b in zip(("dq", "dk", "dv"), *grads):
        assert torch.equal(a, b), f"{name}: two identical backward passes differ"


# ---------------------------------------------------------------------------
# Layouts and scale.


@pytest.mark.parametrize("storage", ["contiguous", "transposed"])
def test_bhsd_equals_bshd_transposed(storage):
    q, k, v = make_qkv(2, 33, 47, 4, 2, 32, layout="bhsd", storage=storage)
    out, lse = attention(q, k, v, causal=True, layout="bhsd", return_lse=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert out.shape == q.shape, f"bhsd output must be (batch, heads, seqlen, headdim), got {tuple(out.shape)}"
    qs, ks, vs = (t.detach().transpose(1, 2).clone().requires_grad_() for t in (q, k, v))
    out_s, lse_s = attention(qs, ks, vs, causal=True, return_lse=True)
    out_s.backward(dout.transpose(1, 2))
    assert max_error(out, out_s.transpose(1, 2)) <= 1e-6, "bhsd output is not the transposed bshd output"
    assert max_error(lse, lse_s) <= 1e-6, "lse depends on the layout"
    for name, a, b in (("dq", q, qs), ("dk", k, ks), ("dv", v, vs)):
        assert a.grad.shape == a.shape
        assert max_error(a.grad, b.grad.transpose(1, 2)) <= 1e-6, f"{name}: bhsd gradient is not the transpose"


def test_default_scale_is_inverse_sqrt_headdim():
    q, k, v = make_qkv(1, 25, 25, 2, 2, 48, requires_grad=False)
    default = attention(q, k, v)
    explicit = attention(q, k, v, softmax_scale=1 / math.sqrt(48))
    assert torch.equal(default, explicit), "default scale is not 1/sqrt(headdim)"
    assert max_error(default, flashtile.naive_attention(q, k, v, softmax_scale=1 / math.sqrt(48))) < 1e-5


@pytest.mark.parametrize("scale", [0.05, 0.5, 2, 1.7])
def test_custom_softmax_scale(scale):
    q, k, v = make_qkv(1, 25, 31, 2, 2, 48)

    def fn(q, k, v):
        return attention(q, k, v, causal=True, softmax_scale=scale, return_lse=True)

    results = check_against_oracle(fn, q, k, v, causal=True, softmax_scale=scale)
    default = flashtile.naive_attention(q.detach(), k.detach(), v.detach(), causal=True)
    assert max_error(results["out"], default) > 1e-3, f"softmax_scale={scale} had no effect"


# ---------------------------------------------------------------------------
# Backend selection.


@pytest.mark.parametrize("value, expected", [
    (None, "reference"),
    ("", "reference"),
    ("auto", "reference"),
    ("reference", "reference"),
    ("  Reference ", "reference"),
    ("triton", "triton"),  # Triton's interpreter, since conftest sets TRITON_INTERPRET=1 without a GPU
])
def test_select_backend_for_cpu_tensors(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("FLASHTILE_BACKEND", raising=False)
    else:
        monkeypatch.setenv("FLASHTILE_BACKEND", value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(CPU, torch.float32) == expected


def test_select_backend_auto_picks_triton_for_cuda_tensors(monkeypatch):
    # Only the device type is looked at: no GPU (or driver) is needed for this.
    monkeypatch.setenv("FLASHTILE_BACKEND", "auto")
    cuda = torch.device("cuda", 0)
    assert select_backend(cuda, torch.float16) == "triton"
    assert select_backend(cuda, torch.bfloat16) == "triton"
    assert select_backend(cuda, torch.float64) == "reference", "float64 must stay on the exact reference path"
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    assert select_backend(cuda, torch.float16) == "reference"


def test_select_backend_invalid_value(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "cuda")
    with pytest.raises(ValueError, match=r"FLASHTILE_BACKEND: expected one of auto, triton, reference, got 'cuda'"):
        select_backend(CPU, torch.float32)
    q, k, v = make_qkv(1, 4, 4, 1, 1, 8, requires_grad=False)
    with pytest.raises(ValueError, match="FLASHTILE_BACKEND"):
        attention(q, k, v)


def test_select_backend_triton_without_interpreter(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("with a GPU, the CPU case is the same but harder to isolate")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="FLASHTILE_BACKEND=triton.*TRITON_INTERPRET=1"):
        select_backend(CPU, torch.float32)


def test_select_backend_meta_device(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "auto")
    assert select_backend(torch.device("meta"), torch.float16) == "reference"
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    with pytest.raises(RuntimeError, match="need CUDA tensors"):
        select_backend(torch.device("meta"), torch.float16)


def test_backend_status(monkeypatch):
    statuses = backend_status()
    assert [s.name for s in statuses] == ["triton", "reference"]
    assert all(isinstance(s, BackendStatus) and isinstance(s.reason, str) and s.reason for s in statuses)
    triton, reference = statuses
    assert reference.available, "the reference backend runs anywhere"
    if torch.cuda.is_available():
        assert triton.available and "CUDA" in triton.reason
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton = backend_status()[0]
    assert triton.available and "TRITON_INTERPRET=1" in triton.reason, triton
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    triton = backend_status()[0]
    assert not triton.available, "without a GPU or the interpreter, Triton must be reported unavailable"
    assert "TRITON_INTERPRET=1" in triton.reason, f"the reason should say how to enable it: {triton.reason!r}"


# ---------------------------------------------------------------------------
# torch.compile and the custom-op contract.


class TinyAttention(torch.nn.Module):
    def forward(self, q, k, v, slopes):
        out, lse = attention(q, k, v, causal=True, window_size=(24, 0), softcap=4.0, alibi_slopes=slopes,
                             return_lse=True)
        return out * 2 + 1, lse


def _compiled_matches_eager(backend):
    torch._dynamo.reset()
    q, k, v = make_qkv(2, 33, 40, 4, 2, 16)
    slopes = random_slopes(4)
    dout, dlse = torch.randn(q.shape), torch.randn(2, 4, 33)

    def run(module):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, lse = module(*leaves, slopes)
        ((out * dout).sum() + (lse * dlse).sum()).backward()
        return [out.detach(), lse.detach()] + [t.grad for t in leaves]

    eager = run(TinyAttention())
    compiled = run(torch.compile(TinyAttention(), fullgraph=True, backend=backend))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), compiled, eager):
        assert max_error(a, b) <= 1e-6, f"{name}: torch.compile(backend={backend!r}) differs from eager"
    explanation = torch._dynamo.explain(TinyAttention())(q, k, v, slopes)
    assert explanation.graph_break_count == 0, f"graph breaks: {explanation.break_reasons}"
    torch._dynamo.reset()


def test_torch_compile_fullgraph_aot_eager():
    # Dynamo tracing, fake impls and the registered autograd, without a C++ build.
    _compiled_matches_eager("aot_eager")


@pytest.mark.slow  # inductor compiles C++ for the CPU: ~22 s cold on 2 cores
def test_torch_compile_fullgraph_inductor():
    _compiled_matches_eager("inductor")


OP_CASES = {
    "bshd-gqa-causal": dict(layout="bshd", shape=(2, 9, 5, 4, 2, 16), args=(0.25, None, 0, 0.0, None)),
    "bhsd-window-softcap-alibi": dict(layout="bhsd", shape=(1, 7, 12, 2, 2, 8), args=(0.3, 3, 1, 2.0, "alibi")),
}


@pytest.mark.parametrize("name", list(OP_CASES))
def test_opcheck_attention_forward(name):
    spec = OP_CASES[name]
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim = spec["shape"]
    # Inputs without grad: the op carries no autograd formula of its own (it lives in
    # ops._AttentionFunction, around the op); the gradients are checked through the faces.
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, layout=spec["layout"],
                       requires_grad=False)
    scale, left, right, softcap, alibi = spec["args"]
    slopes = random_slopes(heads_q) if alibi else None
    args = (q, k, v, spec["layout"], scale, left, right, softcap, slopes, "reference", False, None, 0.0, None, None,
            None, 0, 0, None)
    result = torch.library.opcheck(torch.ops.flashtile.attention_forward.default, args)
    failed = {test: status for test, status in result.items() if status != "SUCCESS"}
    assert not failed, f"opcheck failed: {failed}"


def test_the_op_called_directly_refuses_inputs_that_need_a_gradient():
    # The op's gradient lives in ops.attention's autograd.Function: called on its own with
    # grad-requiring inputs it would give outputs whose backward silently computes nothing.
    q, k, v = make_qkv(1, 9, 6, 2, 1, 16)
    args = (q, k, v, "bshd", 0.25, None, 0, 0.0, None, "reference", False, None, 0.0, None, None, None, 0, 0)
    with pytest.raises(RuntimeError, match=r"^flashtile::attention_forward has no gradient of its own"):
        torch.ops.flashtile.attention_forward(*args)
    out, _ = flashtile.ops.attention(*args)
    assert torch.autograd.grad(out.sum(), q)[0].abs().sum() > 0


@pytest.fixture
def op_paths(monkeypatch):
    """Which way each attention call took: 'op' (torch.library's dispatcher) or 'direct' (the
    op's body called as a function), forward and backward."""
    from flashtile import ops

    paths = []

    def recorded(path, fn):
        def record(*args):
            paths.append(path)
            return fn(*args)
        return record

    for name in ("attention_forward", "attention_backward"):
        monkeypatch.setattr(ops, name, recorded("op", getattr(ops, name)))
        monkeypatch.setattr(ops, "_" + name, recorded("direct", getattr(ops, "_" + name)))
    return paths


def _forward_backward():
    q, k, v = make_qkv(1, 9, 6, 2, 1, 16)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    grads = torch.autograd.grad((out.sum() + lse.sum()), (q, k, v))
    return out, lse, grads


def test_plain_eager_calls_skip_the_dispatcher_and_give_what_the_ops_give(op_paths):
    torch.manual_seed(0)
    direct = _forward_backward()
    assert op_paths == ["direct", "direct"]
    torch.manual_seed(0)
    with torch.profiler.profile() as profile:  # a listener: the ops, and their names in its trace
        through_ops = _forward_backward()
    assert op_paths[2:] == ["op", "op"]
    names = {event.name for event in profile.events()}
    assert {"flashtile::attention_forward", "flashtile::attention_backward"} <= names
    out, lse, grads = direct
    for a, b in zip((out, lse, *grads), (through_ops[0], through_ops[1], *through_ops[2])):
        assert torch.equal(a, b)


def test_modes_and_other_devices_keep_the_ops(op_paths):
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = make_qkv(1, 9, 6, 2, 1, 16, requires_grad=False)
    with FlopCounterMode(display=False):  # a dispatch mode
        attention(q, k, v)
    with torch.device("cpu"):  # a torch-function mode
        attention(q, k, v)
    assert op_paths == ["op", "op"]
    meta = [t.to("meta") for t in (q, k, v)]  # the ops' meta kernel answers: shapes, no computing
    out = attention(*meta)
    assert out.device.type == "meta" and out.shape == q.shape and op_paths[2:] == ["op"]
    # vmap's tensors look plain inside the transform: the op, batched by torch's fallback (one
    # call per batch entry), gives each entry's own answer
    stacked = torch.stack([q, 2 * q, -q])
    batched = torch.vmap(lambda x: attention(x, k, v, causal=True))(stacked)
    assert op_paths[3:] == ["op"]
    for entry, x in zip(batched, stacked):
        assert torch.equal(entry, attention(x, k, v, causal=True))


def test_opcheck_attention_backward():
    q, k, v = make_qkv(1, 9, 6, 2, 1, 16, requires_grad=False)
    out, lse = torch.ops.flashtile.attention_forward(q, k, v, "bshd", 0.25, None, 0, 0.0, None, "reference", False,
                                                     None, 0.0, None, None, None, 0, 0, None)
    for dlse in (torch.randn_like(lse), None):
        args = (torch.randn_like(out), dlse, q, k, v, out, lse, "bshd", 0.25, None, 0, 0.0, None, "reference", False,
                None, 0.0, None, None, None, 0, 0, None, None, False)
        result = torch.library.opcheck(torch.ops.flashtile.attention_backward.default, args)
        failed = {test: status for test, status in result.items() if status != "SUCCESS"}
        assert not failed, f"opcheck failed (dlse={'given' if dlse is not None else None}): {failed}"
