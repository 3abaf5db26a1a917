"""flash-attn 2.x's ``flash_attn_with_kvcache``: decoding and chunked prefill over a KV cache.

Shapes (flash-attn's):
    q                       (batch, seqlen_q, heads_q, headdim)
    k_cache, v_cache        (batch_cache, seqlen_cache, heads_kv, headdim), or paged:
                            (num_blocks, page_size, heads_kv, headdim) with block_table
    block_table             (batch, max_pages) int32: page j of sequence b is block_table[b, j]
    k, v (optional)         (batch, seqlen_new, heads_kv, headdim): appended in place at
                            cache_seqlens before attending
    cache_seqlens           int or (batch,) int32: tokens already in the cache
    cache_batch_idx         (batch,) int32: which cache row each batch entry uses
    cache_leftpad           (batch,) int32: the cache of entry b starts at cache_leftpad[b]
    rotary_cos, rotary_sin  (max_position, rotary_dim / 2): RoPE for q and the new k

Causal masks are aligned bottom-right (query i of the new tokens sees the cache up to
its own position). The attention splits the cache across programs (split-KV) and
merges the parts by LSE in one combine kernel; ``num_splits=0`` picks the number from the
shapes and the GPU.
"""

from __future__ import annotations

import torch

from .backends import select_backend, tf32_allowed
from .masks import Band, normalize_window
from .reference.tiled import tiled_attention_forward
from .rotary import apply_rotary
from .validation import check_backend_limits, check_int32_tensor, check_on_device, check_options, check_tensor

MAX_SPLITS = 128  # the automatic choice (choose_num_splits) stays at or below 64


def _check_index(name: str, t, shape: tuple[int, ...], device) -> None:
    check_int32_tensor(name, t, device)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def _cache_index(positions: torch.Tensor, cache: torch.Tensor, block_table, batch_idx) -> tuple:
    """Index of the cache entries at positions (B, S_new): k_cache[index] is (B, S_new, Hkv, D).

    The reference backend's write, built once for both caches; the Triton backend appends
    in one kernel instead (kernels/append.py).
    """
    if block_table is not None:
        page_size = cache.shape[1]
        return torch.gather(block_table, 1, positions // page_size).long(), positions % page_size
    rows = batch_idx.long()[:, None] if batch_idx is not None else torch.arange(
        positions.shape[0], device=positions.device)[:, None]
    return rows, positions


def _reference_decode(q, k_cache, v_cache, seqlens_k, batch_idx, leftpad, block_table, softmax_scale, band: Band,
                      softcap, alibi_slopes):
    """The same attention in PyTorch, one sequence at a time: (out (B, Sq, Hq, D), lse (B, Hq, Sq))."""
    batch, seqlen_q, heads_q, _ = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
    for b in range(batch):
        end = int(seqlens_k[b])
        start = int(leftpad[b]) if leftpad is not None else 0
        if block_table is not None:
            page_size = k_cache.shape[1]
            pages = block_table[b, : -(-end // page_size)].long()
            keys, values = k_cache[pages].flatten(0, 1)[start:end], v_cache[pages].flatten(0, 1)[start:end]
        else:
            row = int(batch_idx[b]) if batch_idx is not None else b
            keys, values = k_cache[row, start:end], v_cache[row, start:end]
        if keys.shape[0] == 0:
            out[b], lse[b] = 0, float("-inf")
            continue
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, row_lse = tiled_attention_forward(q[b:b + 1].transpose(1, 2), keys[None].transpose(1, 2),
                                             values[None].transpose(1, 2), softmax_scale, band, softcap, slopes)
        out[b], lse[b] = o[0].transpose(0, 1), row_lse[0]
    return out, lse


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention of q over a KV cache, appending k/v first; shapes in the module docstring.

    Returns out (batch, seqlen_q, heads_q, headdim), and the LSE (batch, heads_q,
    seqlen_q) float32 when ``return_softmax_lse``. Inference only (no backward).
    """
    check_tensor("q", q, 4)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    batch, seqlen_q, heads_q, headdim = q.shape
    device = q.device
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (the dtype of q), got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name}: expected device {device} (the device of q), got {t.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: expected a contiguous last dimension (it is written in place), "
                             f"got stride {t.stride(-1)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (as k_cache), got {tuple(v_cache.shape)}")
    heads_kv = k_cache.shape[2]
    if k_cache.shape[3] != headdim:
        raise ValueError(f"k_cache: expected headdim {headdim} (the headdim of q), got {k_cache.shape[3]}")
    if heads_q % heads_kv:
        raise ValueError(f"k_cache: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")

    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != batch:
            shape = tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__
            raise ValueError(f"block_table: expected shape ({batch}, max_pages), got {shape}")
        _check_index("block_table", block_table, tuple(block_table.shape), device)
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: not supported with a paged cache (block_table)")
        page_size = k_cache.shape[1]
        if page_size % 16:
            raise ValueError(f"k_cache: page size (dim 1 of a paged cache) must be a multiple of 16, got {page_size}")
        capacity = block_table.shape[1] * page_size
        check_on_device(((block_table >= 0) & (block_table < k_cache.shape[0])).all(),
                         f"block_table: expected page indices in [0, {k_cache.shape[0]}) (the cache's blocks)")
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is not None:
            _check_index("cache_batch_idx", cache_batch_idx, (batch,), device)
            check_on_device(((cache_batch_idx >= 0) & (cache_batch_idx < k_cache.shape[0])).all(),
                             f"cache_batch_idx: expected rows in [0, {k_cache.shape[0]}) (the cache's batch)")
        elif k_cache.shape[0] != batch:
            raise ValueError(f"k_cache: expected batch {batch} (the batch of q) without cache_batch_idx, "
                             f"got {k_cache.shape[0]}")

    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and values, or neither")
    seqlen_new = 0
    if k is not None:
        check_tensor("k", k, 4)
        check_tensor("v", v, 4)
        if k.shape != v.shape or k.shape[0] != batch or k.shape[2:] != (heads_kv, headdim):
            raise ValueError(f"k, v: expected shape ({batch}, seqlen_new, {heads_kv}, {headdim}), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        seqlen_new = k.shape[1]

    seqlens_rule = (f"cache_seqlens: expected 0 <= cache_seqlens and cache_seqlens + {seqlen_new} new tokens "
                    f"<= {capacity} (the cache's capacity)")
    leftpad_rule = "cache_leftpad: expected 0 <= cache_leftpad <= cache_seqlens"
    # A length given as an int (or the full cache, when None) is checked on the host; a
    # tensor of lengths on the device, in one check with the left padding: on a GPU every
    # comparison is a launch, and a decode step is short enough for the host to show.
    if cache_seqlens is None or (isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool)):
        if cache_seqlens is None and k is not None:
            raise ValueError("cache_seqlens: required when appending k and v (where should they go?)")
        length = capacity if cache_seqlens is None else cache_seqlens
        if not 0 <= length <= capacity - seqlen_new:
            raise ValueError(seqlens_rule)
        cache_seqlens = torch.full((batch,), length, dtype=torch.int32, device=device)
        if cache_leftpad is not None:
            _check_index("cache_leftpad", cache_leftpad, (batch,), device)
            check_on_device(((cache_leftpad >= 0) & (cache_leftpad <= length)).all(), leftpad_rule)
    else:
        _check_index("cache_seqlens", cache_seqlens, (batch,), device)
        fits = cache_seqlens <= capacity - seqlen_new
        if cache_leftpad is None:
            check_on_device((fits & (cache_seqlens >= 0)).all(), seqlens_rule)
        else:
            _check_index("cache_leftpad", cache_leftpad, (batch,), device)
            leftpad_ok = (cache_leftpad >= 0) & (cache_leftpad <= cache_seqlens)  # implies cache_seqlens >= 0
            # On the CPU the message names the rule broken; on a GPU the assert gives both.
            check_on_device((leftpad_ok & fits).all(), f"{leftpad_rule}; {seqlens_rule}",
                            cpu_message=lambda: leftpad_rule if not leftpad_ok.all() else seqlens_rule)
    # At most MAX_SPLITS: the combine kernel holds every split's row of one query in registers.
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits: expected an int in [0, {MAX_SPLITS}] (0 = choose), got {num_splits!r}")
    softmax_scale = check_options(
        headdim=headdim, batch=batch, heads_q=heads_q, device=device, softmax_scale=softmax_scale,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=0.0,
    )
    band = normalize_window(causal, window_size)

    backend = select_backend(device, q.dtype)
    check_backend_limits(backend, q.dtype, headdim)  # before the cache is written

    if rotary_cos is not None:
        if rotary_sin is None or rotary_sin.shape != rotary_cos.shape or rotary_cos.dim() != 2:
            raise ValueError("rotary_cos, rotary_sin: expected two (max_position, rotary_dim / 2) tables of one shape")
        base = cache_seqlens.long()[:, None]
        if not band.is_full:  # causal or local: each new query at its own position
            q_positions = base + torch.arange(seqlen_q, device=device)
        else:  # as flash-attn: all queries at the position of the first new token
            q_positions = base.expand(batch, seqlen_q)
        q = apply_rotary(q, rotary_cos, rotary_sin, q_positions, rotary_interleaved)
        if k is not None:  # each new key at its cache position
            k = apply_rotary(k, rotary_cos, rotary_sin, base + torch.arange(seqlen_new, device=device),
                             rotary_interleaved)
    if k is not None:
        if backend == "triton":  # one launch, the positions read on the device
            from .kernels.append import append_kv

            append_kv(k, v, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table)
        else:
            positions = cache_seqlens[:, None].long() + torch.arange(seqlen_new, device=device)  # (B, S_new)
            index = _cache_index(positions, k_cache, block_table, cache_batch_idx)
            k_cache[index] = k.to(k_cache.dtype)
            v_cache[index] = v.to(v_cache.dtype)
    seqlens_k = cache_seqlens + seqlen_new if seqlen_new else cache_seqlens  # int32, checked above

    if backend == "triton":
        from .kernels.decode_launch import combine_splits, decode_attention_triton

        out_parts, lse_parts = decode_attention_triton(
            q, k_cache, v_cache, seqlens_k, cache_batch_idx, cache_leftpad, block_table, softmax_scale, band,
            float(softcap), alibi_slopes, num_splits, tf32_allowed(q.dtype))
        if out_parts.shape[0] == 1:  # already in q's dtype
            out, lse = out_parts[0], lse_parts[0]
        else:
            out, lse = combine_splits(out_parts, lse_parts, q.dtype)
    else:
        out, lse = _reference_decode(q, k_cache, v_cache, seqlens_k, cache_batch_idx, cache_leftpad, block_table,
                                     softmax_scale, band, float(softcap), alibi_slopes)
    return (out, lse) if return_softmax_lse else out
