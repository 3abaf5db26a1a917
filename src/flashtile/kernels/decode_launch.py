"""Launcher of the split-KV decode kernel: tile sizes, the number of splits, the grid."""

from __future__ import annotations

import torch

from ..backends import sm_count
from ..masks import Band
from . import fast_launch
from .common import cdiv, next_power_of_2, padded_head_dim
from .configs import interpreting
from .decode import _combine_splits_kernel, _decode_kernel
from .launch import _alibi_args, _dot_precision, _qk_scale


# Programs per SM the split aims for, in two regimes (H200, 132 SMs; docs/performance.md):
# - A grid that fits PROGRAMS_PER_SM per SM is split until it fills that: at batch 32 with 8
#   KV heads (256 programs) one split reads K/V at 3.92-4.43 TB/s, two splits (512 programs)
#   at 3.25-3.67, four (attempt 5) at 0.82-3.83. Batches 1-16 split to reach it.
# - A grid larger than that is split to LARGE_GRID_PROGRAMS_PER_SM: 512 programs (batch 64)
#   read at 87-90% of the copy ceiling with one split, 94-99.5% with two (session 7); 1024
#   (batch 128) reach ~99% with one split, which the rule keeps.
# A paged cache follows the same rule since its loop looks up the block table once a page
# (attempt 20; attempt 18 had given it 4 programs per SM while it drained per tile).
PROGRAMS_PER_SM = 2
LARGE_GRID_PROGRAMS_PER_SM = 8


def choose_num_splits(batch: int, heads_kv: int, m_blocks: int, max_keys: int, device: torch.device) -> int:
    """Splits of the keys for a decode grid of ``batch * heads_kv * m_blocks`` programs (see
    PROGRAMS_PER_SM), each split keeping at least 256 keys.

    Decided from shapes alone (the cache's capacity, not the device-side lengths), so
    choosing never waits on the GPU.
    """
    if device.type != "cuda" or interpreting():
        return 1
    sms = sm_count(device)
    programs = max(batch * heads_kv * m_blocks, 1)
    target = PROGRAMS_PER_SM if programs <= PROGRAMS_PER_SM * sms else LARGE_GRID_PROGRAMS_PER_SM
    return max(1, min(target * sms // programs, cdiv(max_keys, 256), 64))


def _key_block(page_size: int | None) -> int:
    # A K/V tile must not straddle two pages: BLOCK_N divides the page size.
    if interpreting():
        return 16
    for block in (64, 32, 16):
        if page_size is None or page_size % block == 0:
            return block
    raise ValueError(f"block_table: page size must be a multiple of 16, got {page_size}")


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    softmax_scale: float,
    band: Band,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    num_splits: int,
    allow_tf32: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial results of every split: out (splits, B, Sq, Hq, D), LSE (splits, B, Hq, Sq) float32.

    out is float32 when there are several splits (they are merged by :func:`combine_splits`)
    and q's dtype when there is one: then it is the result, written without a cast launch.

    q: (B, Sq, Hq, D); caches: (B_cache, S_cache, Hkv, D), or (blocks, page, Hkv, D)
    with block_table (B, pages per sequence); seqlens_k (B,) int32: valid entries.
    """
    batch, seqlen_q, heads_q, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    group = heads_q // heads_kv
    # The kernel reads entry b at index + b (a block table's row with its stride): strided
    # views of the index tensors (lengths[::2]) are copied; contiguous ones pass as they are.
    seqlens_k, cache_batch_idx, cache_leftpad, block_table = (
        t.contiguous() if t is not None else None for t in (seqlens_k, cache_batch_idx, cache_leftpad, block_table))
    page_size = k_cache.shape[1] if block_table is not None else None
    max_keys = block_table.shape[1] * page_size if block_table is not None else k_cache.shape[1]
    rows = seqlen_q * group
    block_m = max(16, min(64, next_power_of_2(rows)))
    m_blocks = cdiv(rows, block_m)
    if num_splits <= 0:
        num_splits = choose_num_splits(batch, heads_kv, m_blocks, max_keys, q.device)
    block_n = _key_block(page_size)
    out = torch.empty(num_splits, batch, seqlen_q, heads_q, head_dim,
                      dtype=q.dtype if num_splits == 1 else torch.float32, device=q.device)
    lse = torch.empty(num_splits, batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
    dummy = seqlens_k
    alibi, stride_ab, stride_ah = _alibi_args(alibi_slopes, dummy)
    grid = (num_splits, batch * heads_kv, m_blocks)
    fast_launch.launch(
        _decode_kernel, grid,
        q, k_cache, v_cache, out, lse, seqlens_k,
        cache_batch_idx if cache_batch_idx is not None else dummy,
        cache_leftpad if cache_leftpad is not None else dummy,
        block_table if block_table is not None else dummy, alibi,
        *q.stride(), *k_cache.stride(), *v_cache.stride(),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        block_table.stride(0) if block_table is not None else 0, stride_ab, stride_ah,
        seqlen_q, group, heads_kv, page_size or 1, num_splits,
        _qk_scale(softmax_scale, softcap), float(softcap), band.left or 0, band.right or 0,
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=padded_head_dim(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_LEFT=band.left is not None, HAS_RIGHT=band.right is not None, HAS_SOFTCAP=softcap > 0,
        HAS_ALIBI=alibi_slopes is not None, PAGED=block_table is not None,
        HAS_BATCH_IDX=cache_batch_idx is not None, HAS_LEFTPAD=cache_leftpad is not None,
        DOT_PRECISION=_dot_precision(q.dtype, allow_tf32),
        num_warps=1 if interpreting() else 4, num_stages=1 if interpreting() else 3,
    )
    return out, lse


def combine_splits(out_parts: torch.Tensor, lse_parts: torch.Tensor, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the splits of :func:`decode_attention_triton` in one launch.

    out_parts (splits, B, Sq, Hq, D) float32, lse_parts (splits, B, Hq, Sq) float32 →
    out (B, Sq, Hq, D) in ``dtype``, LSE (B, Hq, Sq) float32.
    """
    splits, batch, seqlen_q, heads_q, head_dim = out_parts.shape
    out = torch.empty(batch, seqlen_q, heads_q, head_dim, dtype=dtype, device=out_parts.device)
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=out_parts.device)
    fast_launch.launch(
        _combine_splits_kernel, (batch * seqlen_q * heads_q,),
        out_parts, lse_parts, out, lse,
        out_parts.stride(0), out_parts.stride(1), out_parts.stride(2), out_parts.stride(3),
        lse_parts.stride(0), lse_parts.stride(1), lse_parts.stride(2),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        seqlen_q, heads_q, splits,
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=padded_head_dim(head_dim),
        SPLITS_PADDED=max(2, next_power_of_2(splits)),
        num_warps=1 if interpreting() else 4,
    )
    return out, lse
