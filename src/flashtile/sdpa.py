"""PyTorch's ``scaled_dot_product_attention``, with torch's semantics, on flashtile's kernels.

Layout (batch, heads, seqlen, headdim) (3-d inputs have no head dim); ``is_causal``
is aligned top-left as torch does (query i sees keys 0..i, also when seqlen_q !=
seqlen_k); ``attn_mask`` is boolean (True = may attend) or additive, broadcast as
torch broadcasts it, and becomes the kernels' bias (a boolean mask as 0 / -inf)
with its gradient when it is a float tensor that requires one. A query row that the
mask hides entirely gives 0 (torch 2.13 does the same; older releases gave NaN).

What torch accepts and flashtile does not compute (2-d or empty inputs, a query batch
that broadcasts against the keys', value's headdim different from query's, dropout_p = 1,
what the selected backend cannot take: float64 or headdim > 256 on the GPU) raises
``NotImplementedError``: ``use_flashtile_sdpa()``, which routes a model's
``torch.nn.functional.scaled_dot_product_attention`` calls here for the duration of a
``with`` block, sends those calls back to torch's own function.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from . import ops
from .backends import select_backend, tf32_allowed
from .validation import check_backend_limits, check_bias, check_tensor, last_dim_contiguous

_torch_sdpa = F.scaled_dot_product_attention  # the original, for fallbacks and for restoring


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 3:
        return t.unsqueeze(1)  # (N, L, E) -> (N, 1, L, E)
    if t.dim() > 4:
        return t.flatten(0, t.dim() - 4)  # extra batch dims folded into one
    return t


def _batch_dims(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape[:-2] if t.dim() == 3 else t.shape[:-3])  # (N, L, E) has no head dim


def _broadcast_shape(*shapes) -> tuple[int, ...] | None:
    """The shapes' broadcast, or None when they do not broadcast."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def _mask_as_4d(mask: torch.Tensor, query: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """attn_mask, broadcastable as torch requires to the attention weights (N, ..., L, S),
    as a bias broadcastable to the 4-d view of the problem (see ``_as_4d``)."""
    weights = (*query.shape[:-1], seqlen_k)
    if mask.dim() > len(weights) or _broadcast_shape(mask.shape, weights) != weights:
        raise RuntimeError(f"attn_mask: expected a shape broadcastable to the attention weights {weights} "
                           f"(query's leading dims, L, S), got {tuple(mask.shape)}")
    mask = mask[(None,) * (len(weights) - mask.dim())]  # as many dims as the weights
    if mask.dim() == 3:
        return mask.unsqueeze(1)  # (N, L, S) -> (N, 1, L, S), as the query's head dim
    if mask.dim() > 4:  # the query's extra batch dims are folded into one: fold the mask's alike
        return mask.expand(*query.shape[:-3], *mask.shape[-3:]).flatten(0, mask.dim() - 4)
    return mask


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by flashtile.

    query (N, ..., Hq, L, E), key and value (N, ..., H, S, E); returns (N, ..., Hq, L, E).
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 3:
            raise NotImplementedError(f"{name}: flashtile needs at least 3 dims (N, ..., L, E), got {t.dim()}-d")
        if t.numel() == 0:
            raise NotImplementedError(f"{name}: flashtile needs non-empty tensors, got shape {tuple(t.shape)}")
    if is_causal and attn_mask is not None:
        raise RuntimeError("attn_mask: must be None when is_causal=True (as in torch)")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"value: flashtile needs value's headdim ({value.shape[-1]}) equal to query's "
                                  f"({query.shape[-1]})")
    q, k, v = _as_4d(query), _as_4d(key), _as_4d(value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        check_tensor(name, t, 4)
    batch, heads_q, seqlen_q, headdim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    if _batch_dims(query) != _batch_dims(key) and _broadcast_shape(_batch_dims(query), _batch_dims(key)) is not None:
        raise NotImplementedError(f"key: flashtile needs key's batch dims equal to query's (torch broadcasts "
                                  f"them), got key {tuple(key.shape)} and query {tuple(query.shape)}")
    if k.shape[0] != batch or v.shape[:3] != k.shape[:3]:
        raise RuntimeError(f"key, value: expected batch {batch} and matching shapes, got key {tuple(key.shape)}, "
                           f"value {tuple(value.shape)}")
    if heads_kv != heads_q and not (enable_gqa and heads_q % heads_kv == 0):
        raise RuntimeError(f"key: {heads_kv} heads against query's {heads_q}: pass enable_gqa=True with "
                           "query heads a multiple of key heads")
    for name, t in (("key", k), ("value", v)):
        if t.dtype != q.dtype:
            raise RuntimeError(f"{name}: expected dtype {q.dtype} (the dtype of query), got {t.dtype}")
        if t.device != q.device:
            raise RuntimeError(f"{name}: expected device {q.device} (the device of query), got {t.device}")
    if dropout_p == 1.0:
        raise NotImplementedError("dropout_p: flashtile's kernels scale kept values by 1 / (1 - p), so p = 1 "
                                  "is not computed (torch returns zeros)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: expected a float in [0, 1), got {dropout_p!r}")
    softmax_scale = 1.0 / math.sqrt(headdim) if scale is None else float(scale)

    bias = None
    if attn_mask is not None:
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            raise RuntimeError(f"attn_mask: expected dtype torch.bool, torch.float32 or query's dtype {query.dtype} "
                               f"(as in torch), got {attn_mask.dtype}")
        bias = attn_mask
        if bias.dtype == torch.bool:  # True = may attend: 0 where allowed, -inf elsewhere (at the mask's own size)
            bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill_(~bias, float("-inf"))
        bias = _mask_as_4d(bias, query, seqlen_k)
        check_bias(bias, (batch, heads_q, seqlen_q, seqlen_k), q.device)

    # Top-left causal is the band j <= i + (seqlen_k - seqlen_q) + right with right = seqlen_q - seqlen_k.
    window_right = seqlen_q - seqlen_k if is_causal else None
    seed = ops.new_dropout_seed(q.device) if dropout_p > 0 else None
    backend = select_backend(q.device, q.dtype)
    try:
        check_backend_limits(backend, q.dtype, headdim)
    except (TypeError, ValueError) as err:  # e.g. float64 or headdim > 256 on the GPU: torch computes them
        raise NotImplementedError(str(err)) from err
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    out, _ = ops.attention(
        q, k, v, "bhsd", softmax_scale, None, window_right, 0.0, None, backend,
        tf32_allowed(q.dtype), bias, float(dropout_p), seed, None, None, 0, 0, None,
    )
    return out.reshape(*query.shape[:-1], out.shape[-1])


def _routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    try:
        return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    except NotImplementedError:  # what flashtile cannot compute, torch still can
        return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                           scale=scale, enable_gqa=enable_gqa)


@contextlib.contextmanager
def use_flashtile_sdpa():
    """Inside the block, ``torch.nn.functional.scaled_dot_product_attention`` runs flashtile.

    Only calls made through the module attribute are routed (code that imported the
    function by name beforehand keeps torch's). Undone on exit, also on errors.
    """
    saved = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _routed_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = saved
