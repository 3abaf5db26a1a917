"""flash-attn 2.x's variable-length faces: packed sequences without padding.

q: (total_q, heads_q, headdim), k and v: (total_k, heads_kv, headdim): the sequences
of a batch laid end to end. ``cu_seqlens_q`` (batch + 1,), int32 on the tensors'
device, holds the cumulative starts: sequence b owns rows
``cu_seqlens_q[b] : cu_seqlens_q[b + 1]``. ``max_seqlen_*`` size the launch grid, so
the call never waits on the GPU. The LSE is float32, natural log, (heads_q, total_q).
Rows of the packed tensors past the last sequence get output 0, LSE -inf and zero
gradients.
"""

from __future__ import annotations

import torch

from . import ops
from .backends import select_backend, tf32_allowed
from .masks import normalize_window
from .validation import (check_backend_limits, check_int32_tensor, check_on_device, check_options, check_packed,
                         check_tensor, last_dim_contiguous)


def _check_cu_seqlens(name: str, cu: torch.Tensor, device: torch.device, total: int, batch: int | None,
                      max_seqlen: int, max_name: str) -> None:
    check_int32_tensor(name, cu, device)
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name}: expected a 1-d tensor of batch + 1 >= 2 offsets, got shape {tuple(cu.shape)}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name}: expected {batch + 1} offsets (as cu_seqlens_q), got {cu.shape[0]}")
    message = f"{name}: expected non-decreasing offsets starting >= 0 and ending <= {total} (the packed rows)"
    max_message = f"{max_name}: expected >= every sequence's length in {name}, got {max_seqlen}"
    # One device check (on a GPU each comparison is a launch): the offsets are valid and
    # max_seqlen covers them when every margin is >= 0: cu[0], the lengths, the rows left
    # after cu[-1], and max_seqlen minus each length.
    lengths = cu.diff()
    margins = torch.cat((cu[:1], lengths, total - cu[-1:], max_seqlen - lengths))

    def cpu_message():  # which rule broke, with the offsets (on the CPU they can be shown)
        offsets_ok = bool((margins[: -lengths.shape[0]] >= 0).all())
        return max_message if offsets_ok else f"{message}, got {cu.tolist()}"

    check_on_device((margins >= 0).all(), f"{message}; {max_message}", cpu_message=cpu_message)


def _check_max_seqlen(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    return value


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2.x ``flash_attn_varlen_func`` on packed (total, heads, headdim) tensors.

    Causal masks are aligned bottom-right within each sequence. ``max_seqlen_*`` must be
    at least the longest sequence (larger only costs idle programs). With
    ``return_attn_probs=True`` the result is ``(out, softmax_lse, None)``.
    """
    del deterministic  # the backward is always deterministic
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 3)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (the dtype of q), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (the device of q), got {t.device}")
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"{name}: expected headdim {q.shape[-1]} (the headdim of q), got {t.shape[-1]}")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v: expected (total_k, heads_kv) = {tuple(k.shape[:2])} as k, got {tuple(v.shape[:2])}")
    heads_q, heads_kv, headdim = q.shape[1], k.shape[1], q.shape[2]
    if heads_q % heads_kv:
        raise ValueError(f"k: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}) for grouped-query "
                         "attention; packed tensors are read as (total, heads, headdim)")
    max_seqlen_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device, q.shape[0], None, max_seqlen_q, "max_seqlen_q")
    batch = cu_seqlens_q.shape[0] - 1
    # Self-attention passes one offsets tensor twice: its device check (seven small
    # kernels, each a launch) need not run again.
    if not (cu_seqlens_k is cu_seqlens_q and k.shape[0] == q.shape[0] and max_seqlen_k == max_seqlen_q):
        _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device, k.shape[0], batch, max_seqlen_k, "max_seqlen_k")
    softmax_scale = check_options(
        headdim=headdim, batch=batch, heads_q=heads_q, device=q.device, softmax_scale=softmax_scale,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
    )
    seed = ops.new_dropout_seed(q.device) if dropout_p > 0 else None
    backend = select_backend(q.device, q.dtype)
    check_backend_limits(backend, q.dtype, headdim)
    band = normalize_window(causal, window_size)
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    out, lse = ops.attention(
        q, k, v, "thd", softmax_scale, band.left, band.right, float(softcap), alibi_slopes, backend,
        tf32_allowed(q.dtype), None, float(dropout_p), seed, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, None,
    )
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2.x ``flash_attn_varlen_qkvpacked_func``: qkv (total, 3, heads, headdim)."""
    check_packed("qkv", qkv, "(total, 3, heads, headdim)", 1, 3)
    return flash_attn_varlen_func(
        qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2.x ``flash_attn_varlen_kvpacked_func``: kv (total_k, 2, heads_kv, headdim)."""
    check_packed("kv", kv, "(total_k, 2, heads_kv, headdim)", 1, 2)
    return flash_attn_varlen_func(
        q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )
