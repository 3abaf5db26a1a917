"""Hugging Face transformers backend: ``attn_implementation="FlashTile"``.

    import flashtile.integrations.transformers   # registers "FlashTile" (idempotent)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="FlashTile")

The name is ``ATTN_IMPLEMENTATION``; it is not all lower case on purpose (see there).
Importing this module registers, under that name:

- the attention function in ``transformers.AttentionInterface``. A model calls it with
  query (batch, heads_q, seqlen_q, headdim) and key, value (batch, heads_kv, seqlen_k,
  headdim), the full K/V the cache returns; it returns ``(out, None)`` with out
  (batch, seqlen_q, heads_q, headdim). Grouped-query K/V are read as they are (never
  repeated), and the transposes to flashtile's (batch, seqlen, heads, headdim) are views.
- the mask builder in ``transformers.AttentionMaskInterface`` (transformers >= 4.53).
  Like flash_attention_2's, it gives the attention the 2-d padding mask
  (batch, seqlen_k), True = a real token, or None when nothing is padded; causality and
  the sliding window stay in the kernel, so no (seqlen_q, seqlen_k) mask is ever built.

What a call becomes::

    attention_mask             call                           path
    None                       any                            attention(causal, window band)
    None                       packed (position_ids restart,  flash_attn_varlen_func
                               or cu_seq_lens_* kwargs)
    2-d padding mask           any                            unpad -> flash_attn_varlen_func -> re-pad
    None or left padding       1 new token, no autograd       flash_attn_with_kvcache (split-KV decode;
                                                              checked first)
    4-d mask                   custom masks; transformers     attention(bias=mask), the mask as given
                               < 4.53 always

Causal masks are aligned bottom-right (query i of seqlen_q sees keys up to
i + seqlen_k - seqlen_q), which is where a query of a decoding step stands in the
cache: the same alignment transformers' flash_attention_2 path relies on.

Sliding window ``w``: transformers' sdpa and eager masks let query i see keys
``i - w < j <= i`` (w keys, itself included), so a causal layer gets
``window_size=(w - 1, 0)``; a bidirectional layer sees ``|i - j| <= w``, i.e.
``(w, w)``. Query rows that are padding (mask 0 at their own position) give 0 on the
varlen path; their logits are meaningless under every backend.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

try:
    import transformers
except ImportError as error:  # the optional "hf" extra
    raise ImportError("flashtile.integrations.transformers needs Hugging Face transformers: "
                      "pip install 'flashtile[hf]'") from error

from ..api import attention
from ..kvcache import flash_attn_with_kvcache
from ..ops import needs_grad
from ..varlen import flash_attn_varlen_func

# The name models take as ``attn_implementation``. Not "flashtile": transformers >= 5.0 reads any
# name containing "flash" as a flash-attn kernel to load from the Hugging Face Hub and fails at
# model construction (``is_flash_attention_requested`` tests ``"flash" in name``).
ATTN_IMPLEMENTATION = "FlashTile"


def _window_size(sliding_window, causal: bool) -> tuple[int, int]:
    if sliding_window is None or int(sliding_window) <= 0:
        return (-1, -1)
    w = int(sliding_window)
    return (w - 1, 0) if causal else (w, w)


def _unpad(mask: torch.Tensor):
    """Rows and columns of the real tokens of a (batch, seqlen) bool mask, int32 cu_seqlens, max length."""
    seqlens = mask.sum(dim=1, dtype=torch.int32)
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    rows, cols = mask.nonzero(as_tuple=True)
    return rows, cols, cu_seqlens, int(seqlens.max())


def _padded_attention(q, k, v, mask, **options):
    """Attention of q (B, Sq, Hq, D) over k, v (B, Sk, Hkv, D) where mask (B, Sk) marks real keys.

    The queries are the last Sq positions of the mask (transformers' convention: the
    mask covers the cache and the new tokens). One new token is kept even where its own
    mask entry is 0, as sdpa keeps it; otherwise padded query rows are dropped and give 0.
    """
    batch, seqlen_q, heads_q, headdim = q.shape
    rows_k, cols_k, cu_k, max_k = _unpad(mask)
    k_packed, v_packed = k[rows_k, cols_k], v[rows_k, cols_k]  # (total_k, Hkv, D)
    if seqlen_q == 1:
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
        out = flash_attn_varlen_func(q[:, 0], k_packed, v_packed, cu_q, cu_k, 1, max_k, **options)
        return out[:, None]  # (B, 1, Hq, D)
    if seqlen_q == mask.shape[1]:
        rows_q, cols_q, cu_q, max_q = rows_k, cols_k, cu_k, max_k
    else:
        rows_q, cols_q, cu_q, max_q = _unpad(mask[:, -seqlen_q:])
    if rows_q.numel() == 0:  # every query row is padding
        return q.new_zeros(batch, seqlen_q, heads_q, headdim)
    out = flash_attn_varlen_func(q[rows_q, cols_q], k_packed, v_packed, cu_q, cu_k, max_q, max_k, **options)
    return q.new_zeros(batch, seqlen_q, heads_q, headdim).index_put((rows_q, cols_q), out)


def _left_padding(mask: torch.Tensor) -> torch.Tensor | None:
    """Per-row count of leading padding as int32 (batch,), or None if some row has a hole or trailing padding."""
    seqlen = mask.shape[1]
    leftpad = seqlen - mask.sum(dim=1, dtype=torch.int32)
    real = torch.arange(seqlen, device=mask.device)[None, :] >= leftpad[:, None]
    return leftpad if bool((real == mask).all()) else None


def _packed_cu_seqlens(position_ids, seqlen: int):
    """cu_seqlens (int32) and the longest piece when batch-1 position_ids pack several sequences, else None.

    A sequence starts wherever the position does not follow the previous one, as in
    transformers' own packed-sequence detection (``find_packed_sequence_indices``).
    """
    if not isinstance(position_ids, torch.Tensor) or position_ids.shape[-1] != seqlen or seqlen < 2:
        return None
    if position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    pos = position_ids[0]
    restarts = pos[1:] != pos[:-1] + 1
    if not bool(restarts.any()):  # one sequence: the dense path is the same thing, faster
        return None
    starts = F.pad(restarts.nonzero().flatten() + 1, (1, 0))
    cu_seqlens = torch.cat([starts, starts.new_tensor([seqlen])]).to(torch.int32)
    return cu_seqlens, int(cu_seqlens.diff().max())


def flashtile_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract, computed by flashtile (see the module docstring).

    query (B, Hq, Sq, D), key and value (B, Hkv, Sk, D) -> ((B, Sq, Hq, D), None).
    """
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashtile: attention sinks (s_aux) are not supported; use "
                                  "attn_implementation='eager' or 'sdpa' for this model")
    if kwargs.get("output_attentions", False):
        warnings.warn("flashtile never materialises attention weights: output_attentions gives None",
                      stacklevel=2)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    headdim, v_headdim = query.shape[-1], value.shape[-1]
    if v_headdim < headdim:  # e.g. MLA: pad V up to the shared head dim, crop the output below
        value = F.pad(value, (0, headdim - v_headdim))
    options = dict(dropout_p=float(dropout), softmax_scale=scaling, causal=causal,
                   window_size=_window_size(sliding_window, causal), softcap=float(softcap or 0.0))
    out = _dispatch(query, key, value, attention_mask, options, kwargs)
    return (out[..., :v_headdim] if v_headdim < headdim else out), None


def _dispatch(query, key, value, attention_mask, options, kwargs):
    # (B, H, S, D) -> (B, S, H, D): views, the kernels take strides.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    batch, seqlen_q = q.shape[:2]

    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        # A full mask (custom, or built by transformers < 4.53): it already holds causality and the window.
        bias = attention_mask[:, :, :, : k.shape[1]]
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill_(~bias, float("-inf"))
        return attention(q, k, v, dropout_p=options["dropout_p"], softmax_scale=options["softmax_scale"],
                         softcap=options["softcap"], bias=bias.to(q.dtype))

    mask = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(f"attention_mask: expected a 2-d padding mask (batch, seqlen_k) or a 4-d mask, "
                             f"got shape {tuple(attention_mask.shape)}")
        mask = attention_mask.bool()
        if mask.shape[1] > k.shape[1]:  # a sliding-window cache holds only the last keys
            mask = mask[:, -k.shape[1]:]
        elif mask.shape[1] < k.shape[1]:  # a static cache: slots past the mask are not written yet
            k, v = k[:, : mask.shape[1]], v[:, : mask.shape[1]]
            if bool(mask.all()):  # it only marked where the written keys end
                mask = None

    if seqlen_q == 1 and not needs_grad(q, k, v) and options["dropout_p"] == 0.0:
        leftpad = _left_padding(mask) if mask is not None else None
        if mask is None or leftpad is not None:
            return flash_attn_with_kvcache(q, k, v, cache_leftpad=leftpad, softmax_scale=options["softmax_scale"],
                                           causal=options["causal"], window_size=options["window_size"],
                                           softcap=options["softcap"])

    if mask is not None:
        return _padded_attention(q, k, v, mask, **options)

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if all(x is not None for x in (cu_q, cu_k, max_q, max_k)):  # padding-free batches (DataCollatorWithFlattening)
        out = flash_attn_varlen_func(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                                     v.reshape(-1, *v.shape[2:]), cu_q.to(torch.int32), cu_k.to(torch.int32),
                                     int(max_q), int(max_k), **options)
        return out.view(batch, -1, *out.shape[1:])
    if batch == 1 and k.shape[1] == seqlen_q:
        packed = _packed_cu_seqlens(kwargs.get("position_ids"), seqlen_q)
        if packed is not None:
            cu, longest = packed
            out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, longest, longest, **options)
            return out[None]

    return attention(q, k, v, **options)


def flashtile_attention_mask(batch_size: int, kv_length: int, kv_offset: int = 0, attention_mask=None,
                             cache_position=None, q_length=None, q_offset=0, **kwargs):
    """The mask transformers hands the attention: a 2-d (batch, keys) mask of real keys, or None.

    As flash_attention_2's builder, ``attention_mask`` (batch, seen + new tokens) is cut
    to its last ``kv_length`` columns (what a sliding-window cache holds) and dropped
    when it pads nothing. A static cache returns K/V with unwritten slots at the end
    (kv_length is its capacity): then the mask stops at the last written slot, also
    when there is no padding, and the attention trims K/V to it. transformers calls it
    with keywords: ``q_length`` and ``q_offset`` in recent releases, ``cache_position``
    in older ones (4.53 to 5.0 at least).
    """
    if cache_position is not None:
        end = int(cache_position[-1]) + 1
    else:
        end = int(q_offset) + int(q_length)
    written = end - int(kv_offset)  # keys the cache holds for this step, from the first slot
    if attention_mask is None:
        if written < kv_length:
            device = kwargs.get("device", cache_position.device if cache_position is not None else None)
            return torch.ones(batch_size, written, dtype=torch.bool, device=device)
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def register() -> None:
    """Register ``ATTN_IMPLEMENTATION`` with transformers: the attention function and the mask builder.

    The mask builder only where transformers has the interface for it (>= 4.53).

    Idempotent; runs on ``import flashtile.integrations.transformers``.
    """
    interface = getattr(transformers, "AttentionInterface", None)
    if interface is not None:
        interface.register(ATTN_IMPLEMENTATION, flashtile_attention_forward)
    else:  # older releases (4.48) keep a plain dict
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION] = flashtile_attention_forward
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # transformers < 4.53: models build 4-d masks, taken as a bias
        return
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, flashtile_attention_mask)


register()
