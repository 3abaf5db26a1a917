"""Split-KV decoding over a KV cache, contiguous or paged.

One program per (KV split, batch · KV head, block of query rows). The query rows of
a program are all (query token, query head) pairs that share one KV head, so with
grouped-query attention each K/V tile is read once for the whole group. Every split
walks its share of the cache with the online softmax and writes a normalised
partial output and its LSE; the partial results are merged by LSE afterwards.
Decoding is bound by reading K/V, so every tile applies the full mask: bounds, the
split's range, causal/window band, left padding.
"""

import triton
import triton.language as tl

from .common import LN2, _scores_log2


@triton.jit
def _decode_tile(q, K, V, kv_row, kv_row_v, start_n, offs_n, offs_d, d_ok, lo, hi, head_kv,
                 stride_kh, stride_kd, stride_vh, stride_vd, token, row_ok, seqlen_q, seqlen_k, qk_scale, softcap,
                 alibi_slope, offset, window_left, window_right, m_i, l_i, acc,
                 HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """One K/V tile of keys [start_n, start_n + BLOCK_N) at rows ``kv_row`` (K) and
    ``kv_row_v`` (V) of the cache: the online-softmax step of _attn_fwd_inner's masked
    variant. Returns the updated (m_i, l_i, acc)."""
    cols = start_n + offs_n
    col_ok = (cols >= lo) & (cols < hi)
    kT = tl.load(K + kv_row[None, :] + head_kv * stride_kh + offs_d[:, None] * stride_kd,
                 mask=d_ok[:, None] & col_ok[None, :], other=0.0)
    qk = tl.dot(q, kT, input_precision=DOT_PRECISION)
    s2, _ = _scores_log2(qk, token[:, None], cols[None, :], seqlen_q, seqlen_k, qk_scale, softcap,
                         alibi_slope[:, None], HAS_SOFTCAP, HAS_ALIBI)
    visible = col_ok[None, :] & row_ok[:, None]
    if HAS_RIGHT:
        visible = visible & (cols[None, :] <= token[:, None] + offset + window_right)
    if HAS_LEFT:
        visible = visible & (cols[None, :] >= token[:, None] + offset - window_left)
    s2 = tl.where(visible, s2, float("-inf"))
    m_ij = tl.maximum(m_i, tl.max(s2, 1))
    m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    p = tl.exp2(s2 - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + kv_row_v[:, None] + head_kv * stride_vh + offs_d[None, :] * stride_vd,
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_ij, l_i, acc


@triton.jit
def _decode_kernel(
    Q, K, V, OutPartial, LsePartial, CacheSeqlens, CacheBatchIdx, LeftPad, BlockTable, Alibi,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_os, stride_ob, stride_om, stride_oh,
    stride_ls, stride_lb, stride_lh,
    stride_bt, stride_ab, stride_ah,
    seqlen_q, group_size, num_heads_kv, page_size, num_splits,
    qk_scale, softcap, window_left, window_right,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    split = tl.program_id(0)
    bh = tl.program_id(1)
    block_m = tl.program_id(2)
    batch = bh // num_heads_kv
    head_kv = bh % num_heads_kv

    seqlen_k = tl.load(CacheSeqlens + batch)  # valid cache entries, the new tokens included
    start_k = 0
    if HAS_LEFTPAD:
        start_k = tl.load(LeftPad + batch)
    cache_b = batch
    if HAS_BATCH_IDX:
        cache_b = tl.load(CacheBatchIdx + batch)

    # -- the query rows: (token, head in the group) pairs sharing this KV head
    offs_r = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    token = offs_r // group_size
    head = head_kv * group_size + offs_r % group_size
    row_ok = token < seqlen_q
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(Q + batch.to(tl.int64) * stride_qb + token[:, None] * stride_qm + head[:, None] * stride_qh
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    alibi_slope = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        alibi_slope = tl.load(Alibi + batch * stride_ab + head * stride_ah, mask=row_ok, other=0.0)

    # -- this split's keys: whole tiles of [start_k, seqlen_k), further cut by the band
    n_keys = seqlen_k - start_k
    chunk = tl.cdiv(tl.cdiv(n_keys, num_splits), BLOCK_N) * BLOCK_N
    lo = start_k + split * chunk
    hi = tl.minimum(lo + chunk, seqlen_k)
    offset = seqlen_k - seqlen_q  # bottom-right alignment, in absolute cache positions
    last_token = tl.minimum((block_m * BLOCK_M + BLOCK_M - 1) // group_size, seqlen_q - 1)
    first_token = (block_m * BLOCK_M) // group_size
    if HAS_RIGHT:
        hi = tl.minimum(hi, last_token + offset + window_right + 1)
    if HAS_LEFT:
        lo = tl.maximum(lo, first_token + offset - window_left)
    tile_lo = lo // BLOCK_N * BLOCK_N  # tiles aligned to BLOCK_N, which divides the page size

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    if PAGED:
        # One block-table lookup per page, outside the tile loop. Looked up per tile, each
        # tile's address waited on it, and Triton's pipeline then drained every iteration
        # (sm_90 SASS: DEPBAR 0 against the contiguous loop's 2); now it drains once a page.
        for page_lo in range(tile_lo // page_size * page_size, hi, page_size):
            page = tl.load(BlockTable + batch.to(tl.int64) * stride_bt + page_lo // page_size)
            for start_n in range(tl.maximum(page_lo, tile_lo), tl.minimum(page_lo + page_size, hi), BLOCK_N):
                kv_row = page.to(tl.int64) * stride_kb + (start_n - page_lo + offs_n) * stride_kn
                kv_row_v = page.to(tl.int64) * stride_vb + (start_n - page_lo + offs_n) * stride_vn
                m_i, l_i, acc = _decode_tile(q, K, V, kv_row, kv_row_v, start_n, offs_n, offs_d, d_ok, lo, hi, head_kv,
                                             stride_kh, stride_kd, stride_vh, stride_vd, token, row_ok, seqlen_q,
                                             seqlen_k, qk_scale, softcap, alibi_slope, offset, window_left,
                                             window_right, m_i, l_i, acc, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT,
                                             DOT_PRECISION)
    else:
        for start_n in range(tile_lo, hi, BLOCK_N):
            cols = start_n + offs_n
            kv_row = cache_b.to(tl.int64) * stride_kb + cols.to(tl.int64) * stride_kn
            kv_row_v = cache_b.to(tl.int64) * stride_vb + cols.to(tl.int64) * stride_vn
            m_i, l_i, acc = _decode_tile(q, K, V, kv_row, kv_row_v, start_n, offs_n, offs_d, d_ok, lo, hi, head_kv,
                                         stride_kh, stride_kd, stride_vh, stride_vd, token, row_ok, seqlen_q,
                                         seqlen_k, qk_scale, softcap, alibi_slope, offset, window_left,
                                         window_right, m_i, l_i, acc, HAS_SOFTCAP, HAS_ALIBI, HAS_LEFT, HAS_RIGHT,
                                         DOT_PRECISION)

    empty = l_i == 0.0  # no visible key; a NaN l (NaN inputs) propagates instead
    l_safe = tl.where(empty, 1.0, l_i)
    out = tl.where(empty[:, None], 0.0, acc / l_safe[:, None])
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    tl.store(OutPartial + split.to(tl.int64) * stride_os + batch.to(tl.int64) * stride_ob + token[:, None] * stride_om
             + head[:, None] * stride_oh + offs_d[None, :], out.to(OutPartial.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LsePartial + split.to(tl.int64) * stride_ls + batch.to(tl.int64) * stride_lb + head * stride_lh + token,
             lse, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    OutPartial, LsePartial, Out, Lse,
    stride_os, stride_ob, stride_om, stride_oh,
    stride_ls, stride_lb, stride_lh,
    stride_out_b, stride_out_m, stride_out_h,
    stride_lse_b, stride_lse_h,
    seqlen_q, heads_q, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, SPLITS_PADDED: tl.constexpr,
):
    """Merge the splits' partial results of one (batch, query token, query head) row by LSE.

    One launch instead of a chain of elementwise torch ops (at 33 splits, ~130 of them):
    decoding a small batch is otherwise bound by the host. The rules of
    ``merge_attention_states``: a split with LSE -inf (it saw no key) gets weight exactly
    0; a row where every split is empty gives out 0 and LSE -inf; a NaN or +inf LSE gives NaN.
    """
    row = tl.program_id(0)
    head = row % heads_q
    token = (row // heads_q) % seqlen_q
    batch = row // (heads_q * seqlen_q)
    offs_s = tl.arange(0, SPLITS_PADDED)
    s_ok = offs_s < num_splits
    lse = tl.load(LsePartial + offs_s * stride_ls + batch.to(tl.int64) * stride_lb + head * stride_lh + token,
                  mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every split empty: any finite shift
    w = tl.exp(lse - m_safe)  # 0 for an empty split; NaN from a NaN or +inf LSE propagates
    total = tl.sum(w, 0)
    p = w / tl.where(total > 0, total, 1.0)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d < HEAD_DIM
    # An empty split's rows are not read (its output is 0 by convention, whatever the buffer holds).
    parts = tl.load(OutPartial + offs_s[:, None].to(tl.int64) * stride_os + batch.to(tl.int64) * stride_ob
                    + token * stride_om + head * stride_oh + offs_d[None, :],
                    mask=(s_ok & (lse != float("-inf")))[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(parts * p[:, None], 0)
    tl.store(Out + batch.to(tl.int64) * stride_out_b + token * stride_out_m + head * stride_out_h + offs_d,
             out.to(Out.dtype.element_ty), mask=d_ok)
    tl.store(Lse + batch * stride_lse_b + head * stride_lse_h + token, m_safe + tl.log(total))
