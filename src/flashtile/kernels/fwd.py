"""Forward kernel: one program per (Q tile, batch, query head).

The Q tile stays in registers/shared memory while the program walks the K/V tiles
of its band with an online softmax (see reference/tiled.py for the same algorithm
in PyTorch). Only O and the LSE are written: nothing N×N ever reaches HBM.
"""

import triton
import triton.language as tl

from .common import LN2, LOG2E, _band_mask, _dropout_keep, _key_tiles, _load_bias, _scores_log2


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd,
    Bias_head, stride_bm, stride_bn, seed, bh, dropout_p,
    start_lo, start_hi, offs_m, offs_n, offs_d,
    seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right,
    Idx, MaskBuf, ScoreBuf, batch, head, DescK, DescV, head_kv,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SPARSE: tl.constexpr, STEP: tl.constexpr, MASK_MOD: tl.constexpr,
    SCORE_MOD: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Visit K/V tiles starting in [start_lo, start_hi); returns the updated (acc, l_i, m_i).

    MASKED tiles straddle the band's edge or the end of the keys and pay for the mask;
    the others are known to be fully visible and skip it. With SPARSE the range runs
    over a block mask's list ``Idx`` of tile numbers instead (STEP 1), and MASKED
    tiles evaluate the user's MASK_MOD. With USE_TMA the K and V tiles come through
    tensor descriptors (Hopper's TMA: one bulk copy per tile instead of an address per
    element; rows past the keys and columns past the head dim arrive as zeros).
    """
    # 64-bit start offset; within a tile the offsets are small.
    kT_ptrs = K_head + start_lo.to(tl.int64) * stride_kn + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = V_head + start_lo.to(tl.int64) * stride_vn + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    d_ok = offs_d < HEAD_DIM
    for it in range(start_lo, start_hi, STEP):
        if SPARSE:  # the next visited tile of the block mask
            start_n = tl.load(Idx + it) * BLOCK_N
            kT_ptrs = K_head + start_n.to(tl.int64) * stride_kn + offs_n[None, :] * stride_kn \
                + offs_d[:, None] * stride_kd
            v_ptrs = V_head + start_n.to(tl.int64) * stride_vn + offs_n[:, None] * stride_vn \
                + offs_d[None, :] * stride_vd
        else:
            start_n = it
        cols = start_n + offs_n
        # -- load K (transposed) and compute the raw scores
        if USE_TMA:
            kT = tl.trans(tl.reshape(DescK.load([batch, head_kv, start_n, 0]), [BLOCK_N, HEAD_DIM_PADDED]))
        elif MASKED:
            kT = tl.load(kT_ptrs, mask=d_ok[:, None] & (cols[None, :] < seqlen_k), other=0.0)
        elif HEAD_DIM != HEAD_DIM_PADDED:
            kT = tl.load(kT_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kT = tl.load(kT_ptrs)
        qk = tl.dot(q, kT, input_precision=DOT_PRECISION)
        s2, _ = _scores_log2(qk, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, qk_scale, softcap,
                             alibi_slope, HAS_SOFTCAP, HAS_ALIBI)
        if SCORE_MOD is not None:  # the user's modifier works in natural-log units
            s2 = SCORE_MOD(s2 * LN2, batch, head, tl.minimum(offs_m, seqlen_q - 1)[:, None],
                           tl.minimum(cols, seqlen_k - 1)[None, :], ScoreBuf) * LOG2E
        if HAS_BIAS:
            s2 += _load_bias(Bias_head, offs_m[:, None], cols[None, :], stride_bm, stride_bn, seqlen_q,
                             seqlen_k) * LOG2E
        if MASKED:
            visible = _band_mask(offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, window_left, window_right,
                                 HAS_LEFT, HAS_RIGHT)
            if MASK_MOD is not None:  # indices clamped in range: a mask may index a tensor with them
                visible = visible & MASK_MOD(batch, head, tl.minimum(offs_m, seqlen_q - 1)[:, None],
                                             tl.minimum(cols, seqlen_k - 1)[None, :], MaskBuf)
            s2 = tl.where(visible, s2, float("-inf"))
        # -- update m_i and l_i; a row that has seen nothing yet keeps m = -inf, and
        #    subtracting 0 instead keeps exp2 away from (-inf) - (-inf) = NaN
        m_ij = tl.maximum(m_i, tl.max(s2, 1))
        m_safe = m_ij
        if MASKED or HAS_BIAS or SCORE_MOD is not None:  # a bias or a score_mod may give -inf
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.exp2(s2 - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:  # the normaliser counts every probability; only P·V drops some
            p = tl.where(_dropout_keep(seed, bh, offs_m, cols, dropout_p), p, 0.0)
        # -- rescale the output so far and add this tile's P·V
        if USE_TMA:
            v = tl.reshape(DescV.load([batch, head_kv, start_n, 0]), [BLOCK_N, HEAD_DIM_PADDED])
        elif MASKED:
            v = tl.load(v_ptrs, mask=d_ok[None, :] & (cols[:, None] < seqlen_k), other=0.0)
        elif HEAD_DIM != HEAD_DIM_PADDED:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_ij
        if not SPARSE:
            kT_ptrs += BLOCK_N * stride_kn
            v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q, K, V, Out, LSE, Alibi, Bias, Cu_seqlens_q, Cu_seqlens_k, KvIdx, KvPartial, KvCount, KvOrder, KvRuns, MaskBuf,
    ScoreBuf, DescK, DescV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_ab, stride_ah,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_im, stride_cb, stride_ch,
    num_heads_q, group_size, seqlen_q, seqlen_k, num_m_blocks,
    qk_scale, softcap, window_left, window_right, Seed, dropout_p,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, USE_TMA: tl.constexpr, FULL_RANGE: tl.constexpr = False,
):
    # A 1-D grid (Q tiles fastest, so the tiles of one head run together and share
    # K/V in L2) has no 65535 limit on batch × heads.
    pid = tl.program_id(0)
    seed = 0
    if HAS_DROPOUT:  # a device scalar drawn from torch's generator: no host sync, compile-friendly
        seed = tl.load(Seed)
    block_m = pid % num_m_blocks
    bh = pid // num_m_blocks
    batch = bh // num_heads_q
    head = bh % num_heads_q
    # The longest rows first, so that the grid does not end on them alone.
    if MASK_MOD is not None:  # the block mask's schedule (BlockMask.kv_order)
        block_m = tl.load(KvOrder + batch * stride_cb + head * stride_ch + block_m)
    elif HAS_RIGHT:  # causal-like: the last Q tiles see the most keys
        block_m = num_m_blocks - 1 - block_m
    head_kv = head // group_size  # GQA: K/V are shared, never repeated in memory
    # Variable-length batches: "batch" is a sequence of the packed tensors (whose batch
    # strides are 0), starting at row cu_seqlens[batch]; the seqlen arguments are maxima.
    start_q = 0
    start_k = 0
    if IS_VARLEN:
        start_q = tl.load(Cu_seqlens_q + batch)
        seqlen_q = tl.load(Cu_seqlens_q + batch + 1) - start_q
        start_k = tl.load(Cu_seqlens_k + batch)
        seqlen_k = tl.load(Cu_seqlens_k + batch + 1) - start_k
    if block_m * BLOCK_M >= seqlen_q:  # a tile past the end of a shorter sequence
        return

    Q_head = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + tl.cast(start_q, tl.int64) * stride_qm
    K_head = K + batch.to(tl.int64) * stride_kb + head_kv.to(tl.int64) * stride_kh \
        + tl.cast(start_k, tl.int64) * stride_kn
    V_head = V + batch.to(tl.int64) * stride_vb + head_kv.to(tl.int64) * stride_vh \
        + tl.cast(start_k, tl.int64) * stride_vn
    O_head = Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh \
        + tl.cast(start_q, tl.int64) * stride_om
    Bias_head = Bias + batch.to(tl.int64) * stride_bb + head.to(tl.int64) * stride_bh
    LSE_head = LSE + batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + start_q

    m_lo = block_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seqlen_q)
    offs_m = m_lo + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    row_ok = offs_m < seqlen_q
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q_head + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = tl.load(Alibi + batch * stride_ab + head * stride_ah)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)

    if MASK_MOD is not None:
        # A block mask lists this Q tile's visited K/V tiles: the partial ones (mask
        # evaluated) first, walked through the list, then the full ones (no mask) run by
        # run, each run a key range as in the built-in kernels (see block_mask.py). With
        # FULL_RANGE every row has one run, walked without the loop over runs: nested in
        # it, the range loop carries 64 more instructions, register moves (sm_90 SASS,
        # d128, 128 x 128: 657 against 593).
        row = batch * stride_cb + head * stride_ch + block_m
        n_partial = tl.load(KvPartial + row)
        n_visited = tl.load(KvCount + row)
        offset = batch.to(tl.int64) * stride_ib + head.to(tl.int64) * stride_ih + block_m * stride_im
        Idx, Runs = KvIdx + offset, KvRuns + offset
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd,
            Bias_head, stride_bm, stride_bn, seed, bh, dropout_p, n_partial * 0, n_partial,
            offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope,
            window_left, window_right, Idx, MaskBuf, ScoreBuf, batch, head, DescK, DescV, head_kv, BLOCK_N,
            HEAD_DIM, HEAD_DIM_PADDED,
            True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, True,
            1, MASK_MOD, SCORE_MOD, USE_TMA)
        pos = n_partial
        if FULL_RANGE:  # the run's length is the rest of the row
            first = tl.load(Idx + pos, mask=pos < n_visited, other=0)
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd,
                Bias_head, stride_bm, stride_bn, seed, bh, dropout_p, first * BLOCK_N,
                (first + n_visited - pos) * BLOCK_N, offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, softcap,
                alibi_slope, window_left, window_right, Idx, MaskBuf, ScoreBuf, batch, head, DescK, DescV, head_kv,
                BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED,
                False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, False,
                BLOCK_N, MASK_MOD, SCORE_MOD, USE_TMA)
            pos = n_visited
        while pos < n_visited:
            first = tl.load(Idx + pos)
            length = tl.load(Runs + pos)
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd,
                Bias_head, stride_bm, stride_bn, seed, bh, dropout_p, first * BLOCK_N, (first + length) * BLOCK_N,
                offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope,
                window_left, window_right, Idx, MaskBuf, ScoreBuf, batch, head, DescK, DescV, head_kv, BLOCK_N,
                HEAD_DIM, HEAD_DIM_PADDED,
                False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, False,
                BLOCK_N, MASK_MOD, SCORE_MOD, USE_TMA)
            pos += length
    else:
        lo, full_lo, full_hi, hi = _key_tiles(m_lo, m_hi, seqlen_q, seqlen_k, window_left, window_right,
                                              BLOCK_N, HAS_LEFT, HAS_RIGHT)
        # Three ranges of K/V tiles, the loop unrolled at compile time: the band's left edge
        # (masked; empty without a left bound), the unmasked middle, then the right edge (the
        # causal diagonal) and the ragged end of the keys (masked).
        for part in tl.static_range(3):
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd,
                Bias_head, stride_bm, stride_bn, seed, bh, dropout_p,
                lo if part == 0 else (full_lo if part == 1 else full_hi),
                full_lo if part == 0 else (full_hi if part == 1 else hi),
                offs_m, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope,
                window_left, window_right, KvIdx, MaskBuf, ScoreBuf, batch, head, DescK, DescV, head_kv, BLOCK_N,
                HEAD_DIM, HEAD_DIM_PADDED,
                part != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, False,
                BLOCK_N, None, SCORE_MOD, USE_TMA)

    # -- epilogue: normalise; rows that saw no key (l = 0 exactly) give O = 0 and LSE = -inf.
    #    A NaN in l (NaN inputs) is not "no key": it propagates, as in standard attention.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = tl.where(empty[:, None], 0.0, acc / l_safe[:, None])
    if HAS_DROPOUT:  # kept probabilities are scaled by 1 / (1 - p)
        out = out * (1.0 / (1.0 - dropout_p))
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    tl.store(LSE_head + offs_m, lse, mask=row_ok)
    o_ptrs = O_head + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
