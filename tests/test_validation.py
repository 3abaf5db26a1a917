"""One test per input error: the right exception type, and a message naming the argument."""

import pytest
import torch

import flashtile
from flashtile import attention, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashtile.testing import max_error

from helpers import random_slopes

pytestmark = pytest.mark.usefixtures("reference_backend")


@pytest.fixture
def qkv():
    """Valid (batch=2, seqlen=8, heads 4:2, headdim=16) bshd inputs."""
    q = torch.randn(2, 8, 4, 16)
    k = torch.randn(2, 8, 2, 16)
    v = torch.randn(2, 8, 2, 16)
    return q, k, v


def test_valid_inputs_pass(qkv):
    # The baseline for every test below: the same call without the defect works.
    out = attention(*qkv, causal=True, window_size=(3, 0), softcap=1.0, alibi_slopes=random_slopes(4),
                    softmax_scale=0.5)
    assert out.shape == qkv[0].shape and torch.isfinite(out).all()


# ---------------------------------------------------------------------------
# Tensors.


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("rank", [3, 5])
def test_wrong_rank(qkv, which, rank):
    args = dict(zip("qkv", qkv))
    t = args[which]
    args[which] = t.flatten(0, 1) if rank == 3 else t.unsqueeze(0)
    with pytest.raises(ValueError, match=rf"^{which}: expected a 4-d tensor, got {rank}-d"):
        attention(**args)


@pytest.mark.parametrize("which", ["k", "v"])
def test_mismatched_batch(qkv, which):
    args = dict(zip("qkv", qkv))
    args[which] = args[which][:1]
    with pytest.raises(ValueError, match=rf"^{which}: expected batch 2 \(the batch of q\), got 1"):
        attention(**args)


def test_mismatched_heads_between_k_and_v(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^v: expected 2 heads \(the heads of k\)"):
        attention(q, k, torch.randn(2, 8, 1, 16))


def test_mismatched_seqlen_between_k_and_v(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^v: expected seqlen 8 \(the seqlen of k\)"):
        attention(q, k, torch.randn(2, 9, 2, 16))


@pytest.mark.parametrize("which", ["k", "v"])
def test_mismatched_headdim(qkv, which):
    args = dict(zip("qkv", qkv))
    args[which] = torch.randn(2, 8, 2, 32)
    with pytest.raises(ValueError, match=rf"^{which}: expected headdim 16 \(the headdim of q\), got 32"):
        attention(**args)


@pytest.mark.parametrize("heads_q, heads_kv", [(4, 3), (2, 4)])
def test_heads_q_not_a_multiple_of_heads_kv(heads_q, heads_kv):
    q = torch.randn(1, 8, heads_q, 16)
    k = v = torch.randn(1, 8, heads_kv, 16)
    with pytest.raises(ValueError, match=rf"heads_q \({heads_q}\) must be a multiple of heads_kv \({heads_kv}\)"):
        attention(q, k, v)


def test_heads_error_names_the_layout():
    q = torch.randn(1, 4, 8, 16)  # bhsd: 4 heads
    k = v = torch.randn(1, 3, 8, 16)
    with pytest.raises(ValueError, match=r"\(batch, heads, seqlen, headdim\)"):
        attention(q, k, v, layout="bhsd")


@pytest.mark.parametrize("which", ["k", "v"])
def test_dtype_mix(qkv, which):
    args = dict(zip("qkv", qkv))
    args[which] = args[which].half()
    expected = rf"^{which}: expected dtype torch.float32 \(the dtype of q\), got torch.float16"
    with pytest.raises(TypeError, match=expected):
        attention(**args)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("which", ["q", "k"])
def test_non_floating_tensors(qkv, which, dtype):
    args = dict(zip("qkv", qkv))
    args[which] = args[which].to(dtype)
    with pytest.raises(TypeError, match=rf"^{which}: expected a floating-point tensor"):
        attention(**args)


def test_unsupported_float_dtype(qkv):
    q, k, v = (t.to(torch.float8_e4m3fn) for t in qkv)
    with pytest.raises(TypeError, match=r"^q: expected dtype float16, bfloat16 or float32, got torch.float8_e4m3fn"):
        attention(q, k, v)


@pytest.mark.parametrize("bad", [None, [[1.0]], 3.0, "q"], ids=["None", "list", "float", "str"])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_tensor_inputs(qkv, which, bad):
    args = dict(zip("qkv", qkv))
    args[which] = bad
    with pytest.raises(TypeError, match=rf"^{which}: expected a torch.Tensor, got {type(bad).__name__}"):
        attention(**args)


@pytest.mark.parametrize("which, shape", [("q", (2, 0, 4, 16)), ("k", (2, 0, 2, 16)), ("q", (0, 8, 4, 16)),
                                          ("v", (2, 8, 2, 0))])
def test_empty_tensors(qkv, which, shape):
    args = dict(zip("qkv", qkv))
    args[which] = torch.randn(shape)
    with pytest.raises(ValueError, match=rf"^{which}: expected a non-empty tensor"):
        attention(**args)


@pytest.mark.parametrize("which", ["k", "v"])
def test_device_mix(qkv, which):
    # The 'meta' device gives a second device on a CPU-only machine.
    args = dict(zip("qkv", qkv))
    args[which] = args[which].to("meta")
    with pytest.raises(ValueError, match=rf"^{which}: expected device cpu \(the device of q\), got meta"):
        attention(**args)


def test_invalid_layout(qkv):
    for layout in ("sbhd", "BSHD", "", None):
        with pytest.raises(ValueError, match=r"^layout: expected 'bshd' or 'bhsd'"):
            attention(*qkv, layout=layout)


# ---------------------------------------------------------------------------
# Options.


@pytest.mark.parametrize("window", [(-2, 0), (0, -5), (1.5, 0), (0, "1"), (True, 0), (None, 0)])
def test_invalid_window_values(qkv, window):
    with pytest.raises(ValueError, match=r"^window_size: expected (left|right) to be an int >= -1"):
        attention(*qkv, window_size=window)
    with pytest.raises(ValueError, match=r"^window_size"):
        flash_attn_func(*qkv, window_size=window)


@pytest.mark.parametrize("window", [(1, 2, 3), (1,), 4, None, "ab"])
def test_window_not_a_pair(qkv, window):
    with pytest.raises(TypeError, match=r"^window_size: expected a pair \(left, right\)"):
        attention(*qkv, window_size=window)
    with pytest.raises(TypeError, match=r"^window_size: expected a pair"):
        flash_attn_func(*qkv, window_size=window)


@pytest.mark.parametrize("scale", [0, 0.0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_invalid_softmax_scale_value(qkv, scale):
    with pytest.raises(ValueError, match=r"^softmax_scale: expected a finite value > 0"):
        attention(*qkv, softmax_scale=scale)
    with pytest.raises(ValueError, match=r"^softmax_scale"):
        flash_attn_func(*qkv, softmax_scale=scale)


@pytest.mark.parametrize("scale", ["0.1", True, [0.1], torch.tensor(0.1)], ids=["str", "bool", "list", "tensor"])
def test_invalid_softmax_scale_type(qkv, scale):
    with pytest.raises(TypeError, match=r"^softmax_scale: expected a float or None"):
        attention(*qkv, softmax_scale=scale)


@pytest.mark.parametrize("softcap", [-1.0, -1e-9, float("nan"), float("inf")])
def test_invalid_softcap(qkv, softcap):
    with pytest.raises(ValueError, match=r"^softcap: expected a finite float >= 0"):
        attention(*qkv, softcap=softcap)


@pytest.mark.parametrize("softcap", ["1.0", True, None], ids=["str", "bool", "None"])
def test_softcap_wrong_type(qkv, softcap):
    with pytest.raises((TypeError, ValueError), match=r"^softcap: expected a finite float"):
        attention(*qkv, softcap=softcap)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), float("inf")])
def test_dropout_p_out_of_range(qkv, p):
    with pytest.raises(ValueError, match=r"^dropout_p: expected a float in \[0, 1\)"):
        attention(*qkv, dropout_p=p)


@pytest.mark.parametrize("p", ["0.1", True, None], ids=["str", "bool", "None"])
def test_dropout_p_wrong_type(qkv, p):
    with pytest.raises((TypeError, ValueError), match=r"^dropout_p: expected a float"):
        attention(*qkv, dropout_p=p)


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True, "7"])
def test_dropout_seed_invalid(seed):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"^dropout_seed: expected an int"):
        attention(q, q, q, dropout_p=0.1, dropout_seed=seed)


@pytest.mark.parametrize("bias,match", [
    (torch.randn(1, 2, 8, 9), r"^bias: expected a shape broadcastable"),  # seqlen_k is 8
    (torch.randn(3, 2, 8, 8), r"^bias: expected a shape broadcastable"),  # batch is 1
    (torch.randn(1, 1, 1, 8, 8), r"^bias: expected a shape broadcastable"),  # 5-d
    (torch.ones(8, 8, dtype=torch.int32), r"^bias: expected a floating-point"),
    ("0", r"^bias: expected a torch.Tensor"),
])
def test_bias_invalid(bias, match):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises((TypeError, ValueError), match=match):
        attention(q, q, q, bias=bias)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_alibi_slopes_wrong_dtype(qkv, dtype):
    with pytest.raises(TypeError, match=rf"^alibi_slopes: expected dtype torch.float32, got {dtype}"):
        attention(*qkv, alibi_slopes=random_slopes(4).to(dtype))


@pytest.mark.parametrize("shape", [(2,), (5,), (2, 2), (3, 4), (1, 4), (4, 1), (2, 4, 1)])
def test_alibi_slopes_wrong_shape(qkv, shape):
    # Valid: (heads_q,) = (4,) or (batch, heads_q) = (2, 4); heads_kv = 2 is not enough.
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected shape \(4,\) or \(2, 4\), got"):
        attention(*qkv, alibi_slopes=random_slopes(*shape))


def test_alibi_slopes_not_a_tensor(qkv):
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected a torch.Tensor or None, got list"):
        attention(*qkv, alibi_slopes=[0.1, 0.2, 0.3, 0.4])


def test_alibi_slopes_wrong_device(qkv):
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected device cpu"):
        attention(*qkv, alibi_slopes=random_slopes(4).to("meta"))


# ---------------------------------------------------------------------------
# Packed faces.


@pytest.mark.parametrize("shape", [(1, 8, 2, 2, 16), (1, 8, 4, 2, 16), (1, 8, 3, 16), (1, 8, 2, 3, 2, 16)])
def test_qkvpacked_wrong_shape(shape):
    with pytest.raises(ValueError, match=r"^qkv: expected shape \(batch, seqlen, 3, heads, headdim\)"):
        flash_attn_qkvpacked_func(torch.randn(shape))


@pytest.mark.parametrize("shape", [(1, 8, 3, 2, 16), (1, 8, 1, 2, 16), (1, 8, 2, 16)])
def test_kvpacked_wrong_shape(shape):
    with pytest.raises(ValueError, match=r"^kv: expected shape \(batch, seqlen_k, 2, heads_kv, headdim\)"):
        flash_attn_kvpacked_func(torch.randn(1, 8, 2, 16), torch.randn(shape))


def test_packed_not_a_tensor():
    with pytest.raises(TypeError, match=r"^qkv: expected a torch.Tensor"):
        flash_attn_qkvpacked_func([[1.0]])
    with pytest.raises(TypeError, match=r"^kv: expected a torch.Tensor"):
        flash_attn_kvpacked_func(torch.randn(1, 8, 2, 16), None)


# ---------------------------------------------------------------------------
# Backend limits.


def test_float64_with_triton_backend(monkeypatch):
    # conftest sets TRITON_INTERPRET=1 without a GPU, so 'triton' is selectable for CPU tensors.
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.randn(1, 8, 2, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^q: float64 is not supported by the Triton kernels"):
        attention(q, q, q)


def test_float64_works_on_the_reference(qkv):
    q, k, v = (t.double() for t in qkv)
    out = attention(q, k, v, causal=True)
    assert out.dtype == torch.float64
    assert max_error(out, flashtile.naive_attention(q, k, v, causal=True)) < 1e-12


def test_headdim_limit_with_triton_backend(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.randn(1, 4, 1, 320)
    with pytest.raises(ValueError, match=r"^q: headdim must be <= 256 for the Triton kernels, got 320"):
        attention(q, q, q)


# ---------------------------------------------------------------------------
# Strided inputs that are accepted.


@pytest.mark.parametrize("how", ["step", "transposed"])
def test_non_contiguous_last_dim_is_copied_and_matches(how):
    def strided(*shape):
        if how == "step":  # every other element of a wider buffer: stride(-1) == 2
            t = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]
        else:  # headdim is the slow axis of a (batch, seqlen, headdim, heads) buffer
            t = torch.randn(shape[0], shape[1], shape[3], shape[2]).transpose(-1, -2)
        assert t.stride(-1) != 1 and t.shape == shape
        return t.requires_grad_()

    q, k, v = strided(2, 21, 4, 16), strided(2, 30, 2, 16), strided(2, 30, 2, 16)
    dout = torch.randn(q.shape)
    out = attention(q, k, v, causal=True)
    out.backward(dout)
    contiguous = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    expected = attention(*contiguous, causal=True)
    expected.backward(dout)
    assert torch.equal(out, expected), "a strided last dim changed the output"
    for name, a, b in zip(("dq", "dk", "dv"), (q, k, v), contiguous):
        assert a.grad.shape == a.shape and torch.equal(a.grad, b.grad), f"{name}: a strided last dim changed it"
    truth = flashtile.naive_attention(q.detach(), k.detach(), v.detach(), causal=True)
    assert max_error(out, truth) < 1e-5, "strided inputs: output far from the oracle"


def test_zero_stride_broadcast_kv_is_accepted():
    # An expanded K/V (stride 0 over batch) is a valid view: read as is, gradients summed.
    q = torch.randn(3, 12, 4, 16, requires_grad=True)
    k_base = torch.randn(1, 12, 2, 16, requires_grad=True)
    v_base = torch.randn(1, 12, 2, 16, requires_grad=True)
    k, v = k_base.expand(3, -1, -1, -1), v_base.expand(3, -1, -1, -1)
    dout = torch.randn(q.shape)
    out = attention(q, k, v, causal=True)
    out.backward(dout)
    k2, v2 = (t.detach().expand(3, -1, -1, -1).contiguous().requires_grad_() for t in (k_base, v_base))
    expected = attention(q.detach(), k2, v2, causal=True)
    expected.backward(dout)
    assert torch.equal(out, expected), "an expanded K/V changed the output"
    assert max_error(k_base.grad, k2.grad.sum(0, keepdim=True)) < 1e-5, "dk of an expanded K is not the batch sum"
    assert max_error(v_base.grad, v2.grad.sum(0, keepdim=True)) < 1e-5, "dv of an expanded V is not the batch sum"
    assert max_error(out, flashtile.naive_attention(q.detach(), k.detach(), v.detach(), causal=True)) < 1e-5
