"""Shared test helpers: inputs in either layout, and the oracle comparison.

``make_qkv`` draws fresh random q/k/v (the autouse ``seed`` fixture makes them
reproducible per test). ``check_against_oracle`` applies the numerical contract of
DESIGN.md: flashtile's error against the float64 oracle must be at most twice
(outputs) or three times (gradients) the error of standard attention computed in
the input dtype, plus 1e-5.
"""

from __future__ import annotations

from typing import Callable

import torch

from flashtile import naive_attention
from flashtile.testing import assert_close_to_oracle

# "bshd" = (batch, seqlen, heads, headdim), "bhsd" = (batch, heads, seqlen, headdim).
# storage "contiguous": a contiguous tensor in that layout; "transposed": a
# transposed view of a contiguous buffer in the other order (so strides vary).
STORAGES = ("contiguous", "transposed")


def make_tensor(batch, seqlen, heads, headdim, *, dtype=torch.float32, layout="bshd", storage=None,
                requires_grad=True, scale=1.0):
    """One (batch, seqlen, heads, headdim) tensor in ``layout``; a leaf when ``requires_grad``.

    ``storage=None`` picks contiguous or transposed at random (seeded per test).
    """
    if storage is None:
        storage = STORAGES[int(torch.randint(0, 2, ()))]
    bshd, bhsd = (batch, seqlen, heads, headdim), (batch, heads, seqlen, headdim)
    want, other = (bshd, bhsd) if layout == "bshd" else (bhsd, bshd)
    if storage == "contiguous":
        t = torch.randn(want, dtype=dtype) * scale
    elif storage == "transposed":
        t = (torch.randn(other, dtype=dtype) * scale).transpose(1, 2)
    else:
        raise ValueError(f"storage: expected one of {STORAGES} or None, got {storage!r}")
    assert tuple(t.shape) == want
    return t.requires_grad_(requires_grad)


def make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, *, dtype=torch.float32, layout="bshd",
             storage=None, requires_grad=True, scale=1.0):
    """q (seqlen_q, heads_q) and k, v (seqlen_k, heads_kv), each with its own random storage choice."""
    q = make_tensor(batch, seqlen_q, heads_q, headdim, dtype=dtype, layout=layout, storage=storage,
                    requires_grad=requires_grad, scale=scale)
    k = make_tensor(batch, seqlen_k, heads_kv, headdim, dtype=dtype, layout=layout, storage=storage,
                    requires_grad=requires_grad, scale=scale)
    v = make_tensor(batch, seqlen_k, heads_kv, headdim, dtype=dtype, layout=layout, storage=storage,
                    requires_grad=requires_grad)
    return q, k, v


def random_slopes(*shape) -> torch.Tensor:
    """Positive float32 ALiBi slopes of the size flash-attn's geometric slopes have."""
    return torch.rand(*shape, dtype=torch.float32) * 0.5 + 0.05


def _finite_lse(lse: torch.Tensor) -> torch.Tensor:
    # Fully masked rows have LSE = -inf; a loss must not multiply it.
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _run(fn, q, k, v, dout, dlse, lse_only=False, none_is_zero=False):
    """Forward, then backward of <out, dout> + <lse, dlse>; returns out, lse, dq, dk, dv.

    ``none_is_zero``: an input the loss does not depend on (v when only the LSE is
    used) gets a zero gradient instead of None; only for the oracle and baseline.
    """
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = fn(*leaves)
    loss = (_finite_lse(lse) * dlse.to(lse.dtype)).sum() if dlse is not None else 0.0
    if not lse_only:
        loss = loss + (out * dout.to(out.dtype)).sum()
    loss.backward()
    grads = [torch.zeros_like(t) if t.grad is None and none_is_zero else t.grad for t in leaves]
    return (out.detach(), lse.detach(), *grads)


def check_against_oracle(
    fn: Callable,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "bshd",
    lse_grad: bool = False,
    lse_only: bool = False,
    label: str = "",
    **options,
) -> dict:
    """Check ``fn(q, k, v) -> (out, lse)`` against the float64 oracle, forward and backward.

    ``options`` (causal, window_size, softmax_scale, softcap, alibi_slopes) go to
    :func:`flashtile.naive_attention`; ``fn`` must already apply the same ones.
    ``lse_grad`` adds a random gradient flowing into the LSE; ``lse_only`` uses
    the LSE alone in the loss. Returns the results keyed by name.
    """
    batch = q.shape[0]
    heads_q, seqlen_q = (q.shape[2], q.shape[1]) if layout == "bshd" else (q.shape[1], q.shape[2])
    dout = torch.randn(q.shape, dtype=q.dtype)
    dlse = torch.randn(batch, heads_q, seqlen_q, dtype=torch.float64) if (lse_grad or lse_only) else None

    def oracle(q_, k_, v_):
        return naive_attention(q_, k_, v_, upcast=True, return_lse=True, layout=layout, **options)

    def baseline(q_, k_, v_):
        return naive_attention(q_, k_, v_, upcast=False, return_lse=True, layout=layout, **options)

    ours = _run(fn, q, k, v, dout, dlse, lse_only)
    truth = _run(oracle, *(t.detach().double() for t in (q, k, v)), dout.double(), dlse, lse_only, True)
    base = _run(baseline, q, k, v, dout, dlse, lse_only, True)

    out, lse = ours[0], ours[1]
    prefix = f"{label}: " if label else ""
    assert out.shape == q.shape, f"{prefix}out: shape {tuple(out.shape)}, expected q's {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"{prefix}out: dtype {out.dtype}, expected q's {q.dtype}"
    expected_lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    assert lse.shape == (batch, heads_q, seqlen_q), f"{prefix}lse: shape {tuple(lse.shape)}"
    assert lse.dtype == expected_lse_dtype, f"{prefix}lse: dtype {lse.dtype}, expected {expected_lse_dtype}"
    assert truth[0].abs().max() > 0, f"{prefix}the oracle's output is all zeros: the test would prove nothing"
    names = ("out", "lse", "dq", "dk", "dv")
    for i, name in enumerate(names):
        assert ours[i] is not None, f"{prefix}{name}: no gradient reached the input"
        assert ours[i].shape == truth[i].shape, (
            f"{prefix}{name}: shape {tuple(ours[i].shape)}, the oracle's is {tuple(truth[i].shape)}"
        )
        assert not torch.isnan(ours[i]).any(), f"{prefix}{name}: NaN in flashtile's result"
        assert_close_to_oracle(prefix + name, ours[i], truth[i], base[i], grad=i >= 2)
    return dict(zip(names, ours)) | {"oracle": dict(zip(names, truth))}


def assert_grads_match_oracle(out, grads, q, k, v, dout, **oracle_options) -> None:
    """``out`` and ``grads`` (dq, dk, dv of <out, dout>) against the float64 oracle on the
    same q, k, v, under the tolerance rule; ``oracle_options`` go to ``naive_attention``."""

    def reference(upcast):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = naive_attention(*leaves, upcast=upcast, **oracle_options)
        return o, torch.autograd.grad(o, leaves, dout.to(o.dtype))

    ref_out, ref_grads = reference(True)
    pt_out, pt_grads = reference(False)
    assert_close_to_oracle("out", out, ref_out, pt_out)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_close_to_oracle(name, g, r, p, grad=True)
