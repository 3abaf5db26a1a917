"""Public faces over the one core: flash-attn 2.x compatible functions and ``attention``.

Shapes (flash-attn convention): q (batch, seqlen_q, heads_q, headdim), k and v
(batch, seqlen_k, heads_kv, headdim) with heads_q % heads_kv == 0. The LSE is
float32, natural log, (batch, heads_q, seqlen_q).

Causal masks with seqlen_q != seqlen_k are aligned bottom-right, as in flash-attn
>= 2.1 (see :mod:`flashtile.masks` for the pictures).
"""

from __future__ import annotations

import torch

from . import ops
from .backends import select_backend
from .masks import normalize_window
from .validation import check_backend_limits, check_options, check_qkv


def _strided_last_dim_to_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernels read rows of headdim as vectors; only a strided last dim forces a copy.
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
    layout: str = "bshd",
):
    """Exact attention, computed tile by tile without an N×N matrix.

    Args:
        q: (batch, seqlen_q, heads_q, headdim) for ``layout="bshd"``, or
            (batch, heads_q, seqlen_q, headdim) for ``layout="bhsd"`` (PyTorch's
            order, taken as is: no copies). float16, bfloat16 or float32.
        k, v: (batch, seqlen_k, heads_kv, headdim) in the same layout.
        causal: mask keys after each query, aligned bottom-right::

                seqlen_q=2, seqlen_k=5:   k0 k1 k2 k3 k4
                                      q0   x  x  x  x  .
                                      q1   x  x  x  x  x

        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softmax_scale: defaults to 1/sqrt(headdim).
        softcap: > 0 caps scores as ``softcap * tanh(s / softcap)``.
        alibi_slopes: float32 (heads_q,) or (batch, heads_q).
        dropout_p: must be 0.0 for now.
        return_lse: also return the LSE, float32 (batch, heads_q, seqlen_q).
        layout: "bshd" or "bhsd".

    Returns:
        out in q's layout and dtype; ``(out, lse)`` when ``return_lse``.

    float32 inputs use full-precision fp32 matmuls unless
    ``torch.backends.cuda.matmul.allow_tf32`` is True, as in PyTorch.
    """
    batch, _, _, heads_q, _, headdim = check_qkv(q, k, v, layout)
    softmax_scale = check_options(
        headdim=headdim, batch=batch, heads_q=heads_q, device=q.device, softmax_scale=softmax_scale,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
    )
    if dropout_p > 0.0:
        raise NotImplementedError("dropout_p: attention dropout is not implemented yet; pass dropout_p=0.0")
    backend = select_backend(q.device, q.dtype)
    check_backend_limits(backend, q.dtype, headdim)
    band = normalize_window(causal, window_size)
    q, k, v = (_strided_last_dim_to_contiguous(t) for t in (q, k, v))
    out, lse = ops.attention_forward(
        q, k, v, layout, softmax_scale, band.left, band.right, float(softcap), alibi_slopes, backend,
        bool(torch.backends.cuda.matmul.allow_tf32),
    )
    return (out, lse) if return_lse else out


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2.x ``flash_attn_func``: q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D).

    ``deterministic`` is accepted for compatibility: flashtile's backward is always
    deterministic (no atomics). With ``return_attn_probs=True`` the result is
    ``(out, softmax_lse, None)``: the probabilities are never materialised.
    """
    del deterministic  # always deterministic
    out, lse = attention(
        q, k, v, causal=causal, window_size=window_size, softmax_scale=softmax_scale, softcap=softcap,
        alibi_slopes=alibi_slopes, dropout_p=dropout_p, return_lse=True,
    )
    return (out, lse, None) if return_attn_probs else out


def _check_packed(name: str, t, rank: int, dim: int, count: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank or t.shape[dim] != count:
        expected = "(batch, seqlen, 3, heads, headdim)" if count == 3 else "(batch, seqlen_k, 2, heads_kv, headdim)"
        raise ValueError(f"{name}: expected shape {expected}, got {tuple(t.shape)}")


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2.x ``flash_attn_qkvpacked_func``: qkv (B, S, 3, H, D); views, no copies."""
    _check_packed("qkv", qkv, 5, 2, 3)
    return flash_attn_func(
        qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs,
    )


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2.x ``flash_attn_kvpacked_func``: q (B, Sq, Hq, D), kv (B, Sk, 2, Hkv, D)."""
    _check_packed("kv", kv, 5, 2, 2)
    return flash_attn_func(
        q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs,
    )
