"""Dropout (counter-based, regenerated in the backward) and additive bias with gradient.

The keep-mask of a call with ``dropout_seed=s`` is ``flashtile.dropout_keep_mask(s, ...)``
on every backend, so the oracle can check outputs and gradients exactly.
"""

from __future__ import annotations

import pytest
import torch

import flashtile
from flashtile.testing import assert_close_to_oracle, max_error

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
# On a CPU machine "triton" runs the kernels in the interpreter (conftest sets TRITON_INTERPRET=1).
BACKENDS = ["reference", "triton"]


def _qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, dtype=torch.float32, device=DEVICE):
    q = torch.randn(batch, seqlen_q, heads_q, headdim, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(batch, seqlen_k, heads_kv, headdim, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(batch, seqlen_k, heads_kv, headdim, dtype=dtype, device=device, requires_grad=True)
    return q, k, v


def _check(q, k, v, *, bias=None, dropout_p=0.0, seed=None, **options):
    """flashtile vs the float64 oracle (and the same-dtype baseline), forward and all gradients."""
    batch, seqlen_q, heads_q = q.shape[:3]
    seqlen_k = k.shape[1]
    mask = None
    if dropout_p > 0:
        mask = flashtile.dropout_keep_mask(seed, dropout_p, batch, heads_q, seqlen_q, seqlen_k, device=q.device)
    leaves = [q, k, v] + ([bias] if bias is not None and bias.requires_grad else [])
    out = flashtile.attention(q, k, v, bias=bias, dropout_p=dropout_p, dropout_seed=seed, **options)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)

    def reference(upcast):
        ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
        qq, kk, vv = ref_leaves[:3]
        bb = ref_leaves[3] if len(ref_leaves) == 4 else bias
        o = flashtile.naive_attention(qq, kk, vv, bias=bb, dropout_p=dropout_p, dropout_mask=mask, upcast=upcast,
                                      **options)
        return o, torch.autograd.grad(o, ref_leaves, dout.to(o.dtype))

    ref_out, ref_grads = reference(True)
    pt_out, pt_grads = reference(False)
    assert_close_to_oracle("out", out, ref_out, pt_out)
    for name, g, r, p in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads, pt_grads):
        assert_close_to_oracle(name, g, r, p, grad=True)
    return out


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (5, 2), "softcap": 4.0}], ids=str)
def test_dropout_matches_oracle_with_the_same_mask(backend, options):
    q, k, v = _qkv(2, 37, 29, 4, 2, 32)
    _check(q, k, v, dropout_p=0.3, seed=1234, **options)


def test_dropout_same_mask_on_both_backends(monkeypatch):
    q, k, v = _qkv(1, 33, 40, 2, 2, 16)
    outs = []
    for backend in BACKENDS:
        monkeypatch.setenv("FLASHTILE_BACKEND", backend)
        outs.append(flashtile.attention(q, k, v, dropout_p=0.5, dropout_seed=99, causal=True))
    assert max_error(outs[0], outs[1]) < 1e-5


def test_dropout_reproducible_and_seeded(backend):
    q, k, v = _qkv(1, 24, 24, 2, 2, 16)
    torch.manual_seed(7)
    a = flashtile.attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(7)
    b = flashtile.attention(q, k, v, dropout_p=0.2)
    c = flashtile.attention(q, k, v, dropout_p=0.2)  # the generator moved on: another mask
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_within_one_percent(p):
    mask = flashtile.dropout_keep_mask(2024, p, 2, 4, 256, 256)
    kept = mask.float().mean().item()
    assert abs(kept - (1 - p)) < 0.01, f"kept {kept:.4f}, expected {1 - p}"


@pytest.mark.parametrize("bias_shape", [(2, 4, 21, 30), (21, 30), (2, 1, 1, 30), (4, 21, 1)], ids=str)
def test_bias_and_its_gradient(backend, bias_shape):
    q, k, v = _qkv(2, 21, 30, 4, 2, 16)
    bias = torch.randn(bias_shape, device=DEVICE, requires_grad=True)
    _check(q, k, v, bias=bias, causal=True)


def test_bias_without_grad_and_with_dropout(backend):
    q, k, v = _qkv(1, 19, 19, 2, 1, 16)
    bias = torch.randn(1, 2, 19, 19, device=DEVICE)
    _check(q, k, v, bias=bias, dropout_p=0.25, seed=5, alibi_slopes=torch.rand(2, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("headdim", [64, 128])
def test_gpu_dropout_and_bias(dtype, headdim, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = _qkv(2, 1000, 777, 8, 2, headdim, dtype=dtype)
    _check(q, k, v, dropout_p=0.17, seed=31337, causal=True)
    bias = torch.randn(8, 1000, 777, device="cuda", dtype=dtype, requires_grad=True)
    _check(q, k, v, bias=bias, window_size=(300, 20))


@pytest.mark.gpu
def test_gpu_keep_mask_equals_reference(monkeypatch):
    # The kernels' Philox draws are the reference's bit for bit, so the GPU kernels and
    # the CPU reference give the same dropped-out result (up to float32 rounding).
    q, k, v = _qkv(1, 300, 300, 2, 2, 64)
    outs = []
    for backend in BACKENDS:
        monkeypatch.setenv("FLASHTILE_BACKEND", backend)
        qq, kk, vv = (t.detach().to("cpu" if backend == "reference" else "cuda") for t in (q, k, v))
        outs.append(flashtile.attention(qq, kk, vv, dropout_p=0.4, dropout_seed=2**40 + 3).cpu())
    assert max_error(outs[0], outs[1]) < 1e-4
