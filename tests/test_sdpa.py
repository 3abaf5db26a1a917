"""flashtile.scaled_dot_product_attention against torch's own, in float64 as the oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashtile
from flashtile.testing import assert_close_to_oracle, max_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def check(q, k, v, **kwargs):
    """Forward and gradients (including a float mask's) against torch in float64."""
    leaves = [q, k, v]
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.requires_grad:
        leaves.append(mask)
    out = flashtile.scaled_dot_product_attention(q, k, v, **kwargs)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)

    def torch_result(dtype):
        ref = [t.detach().to(dtype).requires_grad_() for t in leaves]
        kw = dict(kwargs)
        if mask is not None:
            kw["attn_mask"] = ref[3] if len(ref) == 4 else (mask if mask.dtype == torch.bool else mask.to(dtype))
        o = F.scaled_dot_product_attention(*ref[:3], **kw)
        return o, torch.autograd.grad(o, ref, dout.to(dtype))

    ref_out, ref_grads = torch_result(torch.float64)
    pt_out, pt_grads = torch_result(q.dtype)
    assert out.shape == ref_out.shape
    assert_close_to_oracle("out", out, ref_out, pt_out)
    for name, g, r, p in zip(("dq", "dk", "dv", "dmask"), grads, ref_grads, pt_grads):
        assert_close_to_oracle(name, g, r, p, grad=True)


def _qkv(shape_q, shape_kv, dtype=torch.float32):
    q = torch.randn(shape_q, dtype=dtype, device=DEVICE, requires_grad=True)
    k = torch.randn(shape_kv, dtype=dtype, device=DEVICE, requires_grad=True)
    v = torch.randn(shape_kv, dtype=dtype, device=DEVICE, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("seqlens", [(17, 17), (9, 30), (30, 9)], ids=str)
def test_top_left_causal(backend, seqlens):
    sq, sk = seqlens
    check(*_qkv((2, 3, sq, 16), (2, 3, sk, 16)), is_causal=True)


def test_boolean_mask_broadcast(backend):
    q, k, v = _qkv((2, 2, 13, 16), (2, 2, 21, 16))
    mask = torch.rand(13, 21, device=DEVICE) > 0.3
    mask[:, 0] = True  # every row keeps a key: torch's math gives NaN on fully hidden rows
    check(q, k, v, attn_mask=mask)


def test_float_mask_with_gradient(backend):
    q, k, v = _qkv((2, 2, 13, 16), (2, 2, 21, 16))
    mask = torch.randn(2, 1, 13, 21, device=DEVICE, requires_grad=True)
    check(q, k, v, attn_mask=mask, scale=0.3)


def test_gqa_and_3d_inputs(backend):
    check(*_qkv((2, 8, 11, 16), (2, 2, 11, 16)), enable_gqa=True, is_causal=True)
    check(*_qkv((3, 11, 16), (3, 19, 16)))


@pytest.mark.parametrize("q_shape, mask_shape", [
    ((3, 11, 16), (3, 11, 19)),  # 3-d inputs: the weights are (N, L, S)
    ((3, 11, 16), (3, 1, 19)),
    ((2, 3, 2, 11, 16), (3, 2, 11, 19)),  # 5-d: the mask broadcast over the first batch dim
    ((2, 3, 2, 11, 16), (3, 1, 11, 19)),
    ((2, 3, 2, 11, 16), (2, 1, 1, 11, 19)),
    ((2, 3, 2, 11, 16), (1, 3, 1, 1, 19)),
], ids=str)
def test_masks_broadcast_against_3d_and_5d_inputs_as_in_torch(backend, q_shape, mask_shape):
    # The problem runs as 4-d (a head dim inserted, batch dims folded): the mask is
    # broadcast against the query's own shape first, as torch does.
    k_shape = (*q_shape[:-2], 19, q_shape[-1])
    q, k, v = _qkv(q_shape, k_shape)
    mask = torch.randn(mask_shape, device=DEVICE, requires_grad=True)
    check(q, k, v, attn_mask=mask)


def test_torch_only_cases_fall_back_under_use_flashtile_sdpa():
    # What torch computes and flashtile does not raises NotImplementedError; routed calls
    # then run torch's own function.
    q2d = torch.randn(5, 8)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(2, 2, 5, 8)
    empty = torch.randn(0, 2, 5, 8)
    cases = [((q2d, q2d, q2d), {}), ((q, k, k), {}), ((q, q, q), {"dropout_p": 1.0}), ((empty, empty, empty), {})]
    for args, kwargs in cases:
        with pytest.raises(NotImplementedError):
            flashtile.scaled_dot_product_attention(*args, **kwargs)
        expected = F.scaled_dot_product_attention(*args, **kwargs)
        with flashtile.use_flashtile_sdpa():
            got = F.scaled_dot_product_attention(*args, **kwargs)
        assert torch.equal(got, expected)


def test_fully_hidden_rows_give_zero_not_nan(backend):
    q, k, v = _qkv((1, 1, 4, 16), (1, 1, 6, 16))
    mask = torch.ones(4, 6, dtype=torch.bool, device=DEVICE)
    mask[1] = False
    out = flashtile.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    assert torch.all(out[0, 0, 1] == 0) and torch.isfinite(out).all() and torch.isfinite(q.grad).all()


def test_errors_where_torch_raises():
    q = torch.randn(1, 4, 8, 16)
    k = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match=r"^key: 2 heads against query's 4"):
        flashtile.scaled_dot_product_attention(q, k, k)
    with pytest.raises(RuntimeError, match=r"^attn_mask: must be None when is_causal=True"):
        flashtile.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)
    with pytest.raises(RuntimeError, match=r"^attn_mask: expected a shape broadcastable to the attention weights"):
        flashtile.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 9, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"^attn_mask: expected dtype torch.bool, torch.float32"):
        flashtile.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.float64))
    # Masks torch rejects for these inputs: more dims than the weights, a batch the query lacks.
    for bad_mask in (torch.zeros(1, 1, 4, 8, 8), torch.zeros(2, 4, 8, 8)):
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=bad_mask)
        with pytest.raises(RuntimeError, match=r"^attn_mask: expected a shape broadcastable"):
            flashtile.scaled_dot_product_attention(q, q, q, attn_mask=bad_mask)


def test_use_flashtile_sdpa_routes_and_restores(monkeypatch):
    calls = []
    real = flashtile.sdpa.scaled_dot_product_attention
    monkeypatch.setattr(flashtile.sdpa, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 8, 16)
    with flashtile.use_flashtile_sdpa():
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        # value headdim != query headdim: flashtile declines, torch computes it
        F.scaled_dot_product_attention(q, q, torch.randn(1, 2, 8, 24))
    assert F.scaled_dot_product_attention is original
    assert len(calls) == 2
    assert max_error(out, original(q, q, q, is_causal=True)) < 1e-5


def test_backend_limits_fall_back_under_use_flashtile_sdpa(monkeypatch):
    # headdim 512 is beyond the Triton kernels: torch's own function computes it instead.
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q = torch.randn(1, 1, 3, 512, device=DEVICE)
    with pytest.raises(NotImplementedError, match=r"^q: headdim must be <= 256"):
        flashtile.scaled_dot_product_attention(q, q, q)
    with flashtile.use_flashtile_sdpa():
        got = F.scaled_dot_product_attention(q, q, q)
    assert torch.equal(got, F.scaled_dot_product_attention(q, q, q))


def test_boolean_mask_is_not_expanded_over_folded_batch_dims(monkeypatch):
    # A 5-d query folds its batch dims into one; a (L, S) mask must stay a broadcast (L, S)
    # bias, not one copy per folded batch (it was 32 copies here for a while).
    seen = []
    real = flashtile.ops.attention

    def spy(*args):
        seen.append(args[11])  # the bias
        return real(*args)

    monkeypatch.setattr(flashtile.ops, "attention", spy)
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    q = torch.randn(4, 8, 2, 6, 16)
    mask = torch.rand(6, 6) > 0.3
    mask[:, 0] = True
    out = flashtile.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    bias = seen[0]  # a broadcast view: its storage holds one (L, S) mask
    assert bias.untyped_storage().nbytes() == mask.numel() * bias.element_size(), (tuple(bias.shape), bias.stride())
    assert max_error(out, F.scaled_dot_product_attention(q, q, q, attn_mask=mask)) < 1e-5
