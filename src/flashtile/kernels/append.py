"""Writing a decode step's new keys and values into the KV cache, in one launch.

``flash_attn_with_kvcache(..., k, v, cache_seqlens)`` appends k and v (B, S_new, Hkv, D)
at positions cache_seqlens[b] .. + S_new of each sequence's cache row (contiguous, or
through ``cache_batch_idx``) or pages (through ``block_table``). In PyTorch that is an
index built from the lengths and two indexed writes: about ten small launches, which a
batch-1 decode step pays on the host and, as separate kernels, on the GPU. Here one
program per (sequence, new token) reads its length and page on the device and copies the
token's Hkv × D keys and values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fast_launch
from .common import next_power_of_2
from .configs import interpreting


@triton.jit
def _append_kv_kernel(
    K, V, KCache, VCache, CacheSeqlens, CacheBatchIdx, BlockTable,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_bt, seqlen_new, heads_kv, head_dim, page_size,
    PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    batch = pid // seqlen_new
    token = pid % seqlen_new
    position = tl.load(CacheSeqlens + batch) + token
    if PAGED:  # the page holding this position, and the row inside it
        cache_row = tl.load(BlockTable + batch.to(tl.int64) * stride_bt + position // page_size)
        position = position % page_size
    elif HAS_BATCH_IDX:
        cache_row = tl.load(CacheBatchIdx + batch)
    else:
        cache_row = batch
    offs_d = tl.arange(0, BLOCK_D)
    K_row = K + batch.to(tl.int64) * stride_kb + token.to(tl.int64) * stride_ks
    V_row = V + batch.to(tl.int64) * stride_vb + token.to(tl.int64) * stride_vs
    KCache_row = KCache + cache_row.to(tl.int64) * stride_kcb + position.to(tl.int64) * stride_kcs
    VCache_row = VCache + cache_row.to(tl.int64) * stride_vcb + position.to(tl.int64) * stride_vcs
    for h0 in range(0, heads_kv, BLOCK_H):  # BLOCK_H heads at a time (all of them, at most sizes)
        offs_h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)  # a head-major cache's head stride is large
        inside = (offs_h < heads_kv)[:, None] & (offs_d < head_dim)[None, :]
        k = tl.load(K_row + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=inside)
        v = tl.load(V_row + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=inside)
        tl.store(KCache_row + offs_h[:, None] * stride_kch + offs_d[None, :] * stride_kcd,
                 k.to(KCache.dtype.element_ty), mask=inside)
        tl.store(VCache_row + offs_h[:, None] * stride_vch + offs_d[None, :] * stride_vcd,
                 v.to(VCache.dtype.element_ty), mask=inside)


def append_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              cache_seqlens: torch.Tensor, cache_batch_idx: torch.Tensor | None,
              block_table: torch.Tensor | None) -> None:
    """Write k, v (B, S_new, Hkv, D) into the caches at cache_seqlens[b] + t, in place.

    Caches: (B_cache, S_cache, Hkv, D), row ``cache_batch_idx[b]`` (default b), or paged
    (blocks, page, Hkv, D) through ``block_table`` (B, pages). cache_seqlens (B,) int32;
    every index tensor on the caches' device and already checked by the caller.
    """
    batch, seqlen_new, heads_kv, head_dim = k.shape
    if batch * seqlen_new == 0:
        return
    lengths = cache_seqlens.contiguous()
    batch_idx = cache_batch_idx.contiguous() if cache_batch_idx is not None else lengths  # dummy unless used
    table = block_table.contiguous() if block_table is not None else lengths  # dummy unless PAGED
    block_d = next_power_of_2(head_dim)
    block_h = min(next_power_of_2(heads_kv), max(1, 4096 // block_d))  # <= 4096 elements a copy
    fast_launch.launch(
        _append_kv_kernel, (batch * seqlen_new,),
        k, v, k_cache, v_cache, lengths, batch_idx, table,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        table.stride(0) if block_table is not None else 0, seqlen_new, heads_kv, head_dim,
        k_cache.shape[1] if block_table is not None else 1,
        PAGED=block_table is not None, HAS_BATCH_IDX=cache_batch_idx is not None,
        BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=1 if interpreting() else 4,
    )
