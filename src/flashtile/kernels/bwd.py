"""Backward kernels: P is recomputed tile by tile from the saved LSE; no atomics.

- ``_bwd_preprocess``: D = rowsum(dO ∘ O) (minus the LSE's own gradient, if any).
- ``_bwd_dkdv_kernel``: one program per (K/V tile, batch, KV head); it loops over the
  query heads of its GQA group and their Q tiles, so dK and dV are each written once.
- ``_bwd_dq_kernel``: one program per (Q tile, batch, query head), looping over K/V tiles.

Every output element has exactly one writer, so the backward is bitwise deterministic.
"""

import triton
import triton.language as tl

from .common import (LN2, LOG2E, _band_mask, _dropout_keep, _key_tiles, _load_bias, _query_tiles,
                     _scores_log2)


PREPROCESS_ROWS = 64  # rows of D per _bwd_preprocess program (a divisor of hopper.STATS_ROWS)


@triton.jit
def _bwd_preprocess(
    Out, DO, DLSE, Delta, Cu_seqlens_q, LSE, LSE2, DqSum, Counter,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_padded,
    num_heads_q, seqlen_q, num_m_blocks,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr,
    IS_VARLEN: tl.constexpr, PADDED: tl.constexpr, DQ_SUM_WIDTH: tl.constexpr,
):
    """D = rowsum(dO ∘ O) − dLSE for BLOCK_M rows of one (batch, head).

    Without PADDED, D is written in the LSE's layout (strides stride_lb, stride_lh). With
    PADDED (the Gluon backward's layout, kernels/hopper.py), D and LSE·log2(e) go to
    (B·Hq, stride_padded) rows and the grid covers every padded row: rows past the end and
    rows that saw no key (LSE = −inf) get LSE·log2(e) = +inf, so their P is exactly 0, and
    D = 0 past the end. One launch instead of the six small torch operations that built them.

    With DQ_SUM_WIDTH > 0 (PADDED only) the same rows of the five-product backward's float32 dQ
    sum, (B·Hq·stride_padded, DQ_SUM_WIDTH), are zeroed too, and program 0 zeroes Counter (its
    dynamic scheduler's int32, or None): the launches of two fills fewer before that kernel.
    """
    pid = tl.program_id(0)
    block_m = pid % num_m_blocks
    bh = pid // num_m_blocks
    batch = bh // num_heads_q
    head = bh % num_heads_q
    start_q = 0
    if IS_VARLEN:
        start_q = tl.load(Cu_seqlens_q + batch)
        seqlen_q = tl.load(Cu_seqlens_q + batch + 1) - start_q
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    inside = offs_m < seqlen_q
    mask = inside[:, None] & (offs_d[None, :] < HEAD_DIM)
    rows = (start_q + offs_m[:, None]).to(tl.int64)
    o = tl.load(Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + rows * stride_om
                + offs_d[None, :] * stride_od, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh + rows * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    row_base = batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + start_q  # LSE's layout
    if HAS_DLSE:  # dLSE_i/dS_ij = P_ij, so a gradient into the LSE only shifts D
        delta -= tl.load(DLSE + row_base + offs_m, mask=inside, other=0.0)
    if PADDED:
        padded = bh.to(tl.int64) * stride_padded + offs_m
        lse = tl.load(LSE + row_base + offs_m, mask=inside, other=float("-inf"))
        tl.store(LSE2 + padded, tl.where(lse == float("-inf"), float("inf"), lse * LOG2E))
        tl.store(Delta + padded, delta)
        if DQ_SUM_WIDTH > 0:
            cols = tl.arange(0, DQ_SUM_WIDTH)
            tl.store(DqSum + padded[:, None] * DQ_SUM_WIDTH + cols[None, :],
                     tl.zeros([BLOCK_M, DQ_SUM_WIDTH], dtype=tl.float32))
            if Counter is not None:
                if pid == 0:
                    tl.store(Counter, 0)
    else:
        tl.store(Delta + row_base + offs_m, delta, mask=inside)


@triton.jit
def _lse_log2(LSE_head, rows, seqlen_q, MASKED: tl.constexpr):
    # Base-2 LSE for P = exp2(s2 - lse2). Rows that saw no key (LSE = -inf) and rows
    # past the end get +inf, so that their P is exactly 0 rather than NaN. Without MASKED
    # every row is inside the sequence (an unmasked tile) and the load has no mask: one on
    # a length that is not a compile-time multiple of 16, as a packed batch's lengths never
    # are, made the dK/dV loop 26% longer on sm_90 (609 -> 770 instructions, triton 3.6).
    if MASKED:
        lse = tl.load(LSE_head + rows, mask=rows < seqlen_q, other=float("inf"))
    else:
        lse = tl.load(LSE_head + rows)
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, k, v,
    Q_head, DO_head, LSE_head, D_head, stride_qm, stride_qd, stride_dom, stride_dod,
    Bias_head, stride_bm, stride_bn, seed, bh, dropout_p,
    start_lo, start_hi, offs_n, offs_d,
    seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right,
    Idx, MaskBuf, ScoreBuf, batch, head, DescQ, DescDO,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SPARSE: tl.constexpr, STEP: tl.constexpr, MASK_MOD: tl.constexpr,
    SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Accumulate dK, dV of one K/V tile over the Q tiles starting in [start_lo, start_hi).

    Works in the transposed orientation (keys as rows), so that dV += Pᵀ dO and
    dK += dSᵀ Q are plain products. SPARSE walks a block mask's list ``Idx`` of Q
    tiles instead (see _attn_fwd_inner).
    """
    offs_m = tl.arange(0, BLOCK_M)
    d_ok = offs_d < HEAD_DIM
    qT_ptrs = Q_head + start_lo.to(tl.int64) * stride_qm + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd
    do_ptrs = DO_head + start_lo.to(tl.int64) * stride_dom + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
    for it in range(start_lo, start_hi, STEP):
        if SPARSE:
            start_m = tl.load(Idx + it) * BLOCK_M
            qT_ptrs = Q_head + start_m.to(tl.int64) * stride_qm + offs_m[None, :] * stride_qm \
                + offs_d[:, None] * stride_qd
            do_ptrs = DO_head + start_m.to(tl.int64) * stride_dom + offs_m[:, None] * stride_dom \
                + offs_d[None, :] * stride_dod
        else:
            start_m = it
        rows = start_m + offs_m
        if USE_TMA:  # Q and dO through tensor descriptors (kernels/tma.py)
            qT = tl.trans(tl.reshape(DescQ.load([batch, head, start_m, 0]), [BLOCK_M, HEAD_DIM_PADDED]))
        elif MASKED:
            qT = tl.load(qT_ptrs, mask=d_ok[:, None] & (rows[None, :] < seqlen_q), other=0.0)
        elif HEAD_DIM != HEAD_DIM_PADDED:
            qT = tl.load(qT_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            qT = tl.load(qT_ptrs)
        lse2 = _lse_log2(LSE_head, rows, seqlen_q, MASKED)
        # -- recompute Pᵀ = exp2(Sᵀ - LSE) for this tile
        qkT = tl.dot(k, qT, input_precision=DOT_PRECISION)
        s2T, tanhT = _scores_log2(qkT, rows[None, :], offs_n[:, None], seqlen_q, seqlen_k, qk_scale, softcap,
                                  alibi_slope, HAS_SOFTCAP, HAS_ALIBI)
        if SCORE_MOD is not None:  # natural-log units; its derivative is taken at the unmodified score
            q_idxT = tl.minimum(rows, seqlen_q - 1)[None, :]
            kv_idxT = tl.minimum(offs_n, seqlen_k - 1)[:, None]
            s_preT = s2T * LN2
            s2T = SCORE_MOD(s_preT, batch, head, q_idxT, kv_idxT, ScoreBuf) * LOG2E
        if HAS_BIAS:
            s2T += _load_bias(Bias_head, rows[None, :], offs_n[:, None], stride_bm, stride_bn, seqlen_q,
                              seqlen_k) * LOG2E
        if MASKED:
            visible = _band_mask(rows[None, :], offs_n[:, None], seqlen_q, seqlen_k, window_left, window_right,
                                 HAS_LEFT, HAS_RIGHT)
            if MASK_MOD is not None:
                visible = visible & MASK_MOD(batch, head, tl.minimum(rows, seqlen_q - 1)[None, :],
                                             tl.minimum(offs_n, seqlen_k - 1)[:, None], MaskBuf)
            s2T = tl.where(visible, s2T, float("-inf"))
        pT = tl.exp2(s2T - lse2[None, :])
        if USE_TMA:
            do = tl.reshape(DescDO.load([batch, head, start_m, 0]), [BLOCK_M, HEAD_DIM_PADDED])
        elif MASKED:
            do = tl.load(do_ptrs, mask=d_ok[None, :] & (rows[:, None] < seqlen_q), other=0.0)
        elif HEAD_DIM != HEAD_DIM_PADDED:
            do = tl.load(do_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            do = tl.load(do_ptrs)
        # -- dV += Pᵀ dO (with dropout: the kept, rescaled Pᵀ that the forward multiplied V by)
        if HAS_DROPOUT:
            keepT = tl.trans(_dropout_keep(seed, bh, rows, offs_n, dropout_p))  # drawn (rows, keys), used transposed
            dv = tl.dot((tl.where(keepT, pT, 0.0) * (1.0 / (1.0 - dropout_p))).to(do.dtype), do, dv,
                        input_precision=DOT_PRECISION)
        else:
            dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        # -- dSᵀ = Pᵀ ∘ (dPᵀ - D), dK += dSᵀ Q
        if MASKED:
            delta = tl.load(D_head + rows, mask=rows < seqlen_q, other=0.0)
        else:  # unmasked tile: every row inside the sequence (see _lse_log2)
            delta = tl.load(D_head + rows)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:  # dP flows back only through the kept entries
            dpT = tl.where(keepT, dpT * (1.0 / (1.0 - dropout_p)), 0.0)
        dsT = pT * (dpT - delta[None, :])
        if SCORE_MOD is not None:
            dsT = dsT * SCORE_GRAD(s_preT, batch, head, q_idxT, kv_idxT, ScoreBuf)
        if HAS_SOFTCAP:  # through softcap·tanh(x / softcap): times 1 - tanh²
            dsT = dsT * (1.0 - tanhT * tanhT)
        dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk, input_precision=DOT_PRECISION)
        if not SPARSE:
            qT_ptrs += BLOCK_M * stride_qm
            do_ptrs += BLOCK_M * stride_dom
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, Delta, DK, DV, Alibi, Bias, Cu_seqlens_q, Cu_seqlens_k, QIdx, QPartial, QCount, QOrder, QRuns,
    MaskBuf, ScoreBuf, DescQ, DescDO,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_ab, stride_ah,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_im, stride_cb, stride_ch,
    num_heads_q, num_heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks,
    softmax_scale, qk_scale, softcap, window_left, window_right, Seed, dropout_p,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr, USE_TMA: tl.constexpr,
    FULL_RANGE: tl.constexpr = False,
):
    pid = tl.program_id(0)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(Seed)
    block_n = pid % num_n_blocks
    bh = pid // num_n_blocks
    batch = bh // num_heads_kv
    head_kv = bh % num_heads_kv
    if MASK_MOD is not None:  # the longest Q lists first (BlockMask.q_order, of the group's first head)
        block_n = tl.load(QOrder + batch * stride_cb + head_kv * group_size * stride_ch + block_n)
    start_q = 0
    start_k = 0
    if IS_VARLEN:  # see _fwd_kernel
        start_q = tl.load(Cu_seqlens_q + batch)
        seqlen_q = tl.load(Cu_seqlens_q + batch + 1) - start_q
        start_k = tl.load(Cu_seqlens_k + batch)
        seqlen_k = tl.load(Cu_seqlens_k + batch + 1) - start_k
    if block_n * BLOCK_N >= seqlen_k:
        return

    n_lo = block_n * BLOCK_N
    n_hi = tl.minimum(n_lo + BLOCK_N, seqlen_k)
    offs_n = n_lo + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    cols = (start_k + offs_n[:, None]).to(tl.int64)
    k = tl.load(K + batch.to(tl.int64) * stride_kb + head_kv.to(tl.int64) * stride_kh + cols * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(V + batch.to(tl.int64) * stride_vb + head_kv.to(tl.int64) * stride_vh + cols * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PADDED], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PADDED], dtype=tl.float32)

    lo, full_lo, full_hi, hi = _query_tiles(n_lo, n_hi, seqlen_q, seqlen_k, window_left, window_right,
                                            BLOCK_M, HAS_LEFT, HAS_RIGHT)
    # The query heads of this KV head's group all contribute to the same dK, dV.
    for g in range(0, group_size):
        head = head_kv * group_size + g
        Q_head = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh \
            + tl.cast(start_q, tl.int64) * stride_qm
        DO_head = DO + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh \
            + tl.cast(start_q, tl.int64) * stride_dom
        bh = batch * num_heads_q + head
        row_base = batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + start_q
        Bias_head = Bias + batch.to(tl.int64) * stride_bb + head.to(tl.int64) * stride_bh
        alibi_slope = 0.0
        if HAS_ALIBI:
            alibi_slope = tl.load(Alibi + batch * stride_ab + head * stride_ah)
        args = (Q_head, DO_head, LSE + row_base, Delta + row_base, stride_qm, stride_qd, stride_dom, stride_dod,
                Bias_head, stride_bm, stride_bn, seed, bh, dropout_p)
        if MASK_MOD is not None:  # the block mask's Q tiles of this K/V tile: partial, then full runs
            row = batch * stride_cb + head * stride_ch + block_n
            n_partial = tl.load(QPartial + row)
            n_visited = tl.load(QCount + row)
            offset = batch.to(tl.int64) * stride_ib + head.to(tl.int64) * stride_ih + block_n * stride_im
            Idx, Runs = QIdx + offset, QRuns + offset
            dk, dv = _bwd_dkdv_inner(
                dk, dv, k, v, *args, n_partial * 0, n_partial, offs_n, offs_d, seqlen_q, seqlen_k, qk_scale, softcap,
                alibi_slope, window_left, window_right, Idx, MaskBuf, ScoreBuf, batch, head, DescQ, DescDO,
                BLOCK_M, HEAD_DIM, HEAD_DIM_PADDED, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
                HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, True, 1, MASK_MOD, SCORE_MOD, SCORE_GRAD, USE_TMA)
            pos = n_partial
            if FULL_RANGE:  # one run per row: see _fwd_kernel
                first = tl.load(Idx + pos, mask=pos < n_visited, other=0)
                dk, dv = _bwd_dkdv_inner(
                    dk, dv, k, v, *args, first * BLOCK_M, (first + n_visited - pos) * BLOCK_M, offs_n, offs_d,
                    seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right, Idx, MaskBuf,
                    ScoreBuf, batch, head, DescQ, DescDO, BLOCK_M, HEAD_DIM, HEAD_DIM_PADDED, False, HAS_LEFT,
                    HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, False, BLOCK_M, MASK_MOD,
                    SCORE_MOD, SCORE_GRAD, USE_TMA)
                pos = n_visited
            while pos < n_visited:  # each run of full Q tiles as a query range: see _fwd_kernel
                first = tl.load(Idx + pos)
                length = tl.load(Runs + pos)
                dk, dv = _bwd_dkdv_inner(
                    dk, dv, k, v, *args, first * BLOCK_M, (first + length) * BLOCK_M, offs_n, offs_d, seqlen_q,
                    seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right, Idx, MaskBuf, ScoreBuf,
                    batch, head, DescQ, DescDO, BLOCK_M, HEAD_DIM, HEAD_DIM_PADDED, False, HAS_LEFT, HAS_RIGHT,
                    HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, False, BLOCK_M, MASK_MOD,
                    SCORE_MOD, SCORE_GRAD, USE_TMA)
                pos += length
        else:  # the band's Q tiles, unrolled at compile time: masked edge, unmasked middle, masked edge
            for part in tl.static_range(3):
                dk, dv = _bwd_dkdv_inner(
                    dk, dv, k, v, *args, lo if part == 0 else (full_lo if part == 1 else full_hi),
                    full_lo if part == 0 else (full_hi if part == 1 else hi), offs_n, offs_d, seqlen_q, seqlen_k,
                    qk_scale, softcap, alibi_slope, window_left, window_right, QIdx, MaskBuf, ScoreBuf, batch, head,
                    DescQ, DescDO, BLOCK_M, HEAD_DIM, HEAD_DIM_PADDED, part != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                    HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, DOT_PRECISION, False, BLOCK_M, None, SCORE_MOD, SCORE_GRAD,
                    USE_TMA)

    dk *= softmax_scale
    tl.store(DK + batch.to(tl.int64) * stride_dkb + head_kv.to(tl.int64) * stride_dkh + cols * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + batch.to(tl.int64) * stride_dvb + head_kv.to(tl.int64) * stride_dvh + cols * stride_dvn
             + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse2, delta,
    K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd,
    Bias_head, stride_bm, stride_bn, DBias_head, seed, bh, dropout_p,
    start_lo, start_hi, offs_m, offs_d,
    seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right,
    Idx, MaskBuf, ScoreBuf, batch, head, DescK, DescV, head_kv,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    HAS_DBIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, SPARSE: tl.constexpr, STEP: tl.constexpr,
    MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Accumulate dQ of one Q tile over the K/V tiles starting in [start_lo, start_hi)
    (or over a block mask's list ``Idx`` with SPARSE, see _attn_fwd_inner)."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    kT_ptrs = K_head + start_lo.to(tl.int64) * stride_kn + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    vT_ptrs = V_head + start_lo.to(tl.int64) * stride_vn + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd
    for it in range(start_lo, start_hi, STEP):
        if SPARSE:
            start_n = tl.load(Idx + it) * BLOCK_N
            kT_ptrs = K_head + start_n.to(tl.int64) * stride_kn + offs_n[None, :] * stride_kn \
                + offs_d[:, None] * stride_kd
            vT_ptrs = V_head + start_n.to(tl.int64) * stride_vn + offs_n[None, :] * stride_vn \
                + offs_d[:, None] * stride_vd
        else:
            start_n = it
        cols = start_n + offs_n
        if USE_TMA:  # K and V through tensor descriptors (kernels/tma.py)
            kT = tl.trans(tl.reshape(DescK.load([batch, head_kv, start_n, 0]), [BLOCK_N, HEAD_DIM_PADDED]))
            vT = tl.trans(tl.reshape(DescV.load([batch, head_kv, start_n, 0]), [BLOCK_N, HEAD_DIM_PADDED]))
        elif MASKED:
            kv_mask = d_ok[:, None] & (cols[None, :] < seqlen_k)
            kT = tl.load(kT_ptrs, mask=kv_mask, other=0.0)
            vT = tl.load(vT_ptrs, mask=kv_mask, other=0.0)
        elif HEAD_DIM != HEAD_DIM_PADDED:
            kT = tl.load(kT_ptrs, mask=d_ok[:, None], other=0.0)
            vT = tl.load(vT_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kT = tl.load(kT_ptrs)
            vT = tl.load(vT_ptrs)
        # -- recompute P = exp2(S - LSE)
        qk = tl.dot(q, kT, input_precision=DOT_PRECISION)
        s2, tanh = _scores_log2(qk, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, qk_scale, softcap,
                                alibi_slope, HAS_SOFTCAP, HAS_ALIBI)
        if SCORE_MOD is not None:  # natural-log units; its derivative is taken at the unmodified score
            q_idx = tl.minimum(offs_m, seqlen_q - 1)[:, None]
            kv_idx = tl.minimum(cols, seqlen_k - 1)[None, :]
            s_pre = s2 * LN2
            s2 = SCORE_MOD(s_pre, batch, head, q_idx, kv_idx, ScoreBuf) * LOG2E
        if HAS_BIAS:
            s2 += _load_bias(Bias_head, offs_m[:, None], cols[None, :], stride_bm, stride_bn, seqlen_q,
                             seqlen_k) * LOG2E
        if MASKED:
            visible = _band_mask(offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, window_left, window_right,
                                 HAS_LEFT, HAS_RIGHT)
            if MASK_MOD is not None:
                visible = visible & MASK_MOD(batch, head, tl.minimum(offs_m, seqlen_q - 1)[:, None],
                                             tl.minimum(cols, seqlen_k - 1)[None, :], MaskBuf)
            s2 = tl.where(visible, s2, float("-inf"))
        p = tl.exp2(s2 - lse2[:, None])
        # -- dS = P ∘ (dP - D), dQ += dS K
        dp = tl.dot(do, vT, input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            keep = _dropout_keep(seed, bh, offs_m, cols, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_DBIAS:  # the bias enters after the softcap: its gradient is dS before the tanh factor
            tl.store(DBias_head + offs_m[:, None].to(tl.int64) * seqlen_k + cols[None, :], ds,
                     mask=(offs_m[:, None] < seqlen_q) & (cols[None, :] < seqlen_k))
        if SCORE_MOD is not None:
            ds = ds * SCORE_GRAD(s_pre, batch, head, q_idx, kv_idx, ScoreBuf)
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh * tanh)
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, input_precision=DOT_PRECISION)
        if not SPARSE:
            kT_ptrs += BLOCK_N * stride_kn
            vT_ptrs += BLOCK_N * stride_vn
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, Delta, DQ, Alibi, Bias, DBias, Cu_seqlens_q, Cu_seqlens_k, KvIdx, KvPartial, KvCount,
    KvOrder, KvRuns, MaskBuf, ScoreBuf, DescK, DescV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_ab, stride_ah,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_im, stride_cb, stride_ch,
    num_heads_q, group_size, seqlen_q, seqlen_k, num_m_blocks,
    softmax_scale, qk_scale, softcap, window_left, window_right, Seed, dropout_p,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, HAS_DBIAS: tl.constexpr, IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr, MASK_MOD: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr,
    USE_TMA: tl.constexpr, FULL_RANGE: tl.constexpr = False,
):
    pid = tl.program_id(0)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(Seed)
    block_m = pid % num_m_blocks
    bh = pid // num_m_blocks
    batch = bh // num_heads_q
    head = bh % num_heads_q
    if MASK_MOD is not None:  # the longest rows first, as in _fwd_kernel
        block_m = tl.load(KvOrder + batch * stride_cb + head * stride_ch + block_m)
    elif HAS_RIGHT:
        block_m = num_m_blocks - 1 - block_m
    head_kv = head // group_size
    start_q = 0
    start_k = 0
    if IS_VARLEN:  # see _fwd_kernel
        start_q = tl.load(Cu_seqlens_q + batch)
        seqlen_q = tl.load(Cu_seqlens_q + batch + 1) - start_q
        start_k = tl.load(Cu_seqlens_k + batch)
        seqlen_k = tl.load(Cu_seqlens_k + batch + 1) - start_k
    if block_m * BLOCK_M >= seqlen_q:
        return

    m_lo = block_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seqlen_q)
    offs_m = m_lo + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    rows = (start_q + offs_m[:, None]).to(tl.int64)
    q = tl.load(Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + rows * stride_qm
                + offs_d[None, :] * stride_qd, mask=mask, other=0.0)
    do = tl.load(DO + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh + rows * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0)
    row_base = batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + start_q
    lse2 = _lse_log2(LSE + row_base, offs_m, seqlen_q, True)
    delta = tl.load(Delta + row_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = tl.load(Alibi + batch * stride_ab + head * stride_ah)
    K_head = K + batch.to(tl.int64) * stride_kb + head_kv.to(tl.int64) * stride_kh \
        + tl.cast(start_k, tl.int64) * stride_kn
    V_head = V + batch.to(tl.int64) * stride_vb + head_kv.to(tl.int64) * stride_vh \
        + tl.cast(start_k, tl.int64) * stride_vn
    Bias_head = Bias + batch.to(tl.int64) * stride_bb + head.to(tl.int64) * stride_bh
    DBias_head = DBias + bh.to(tl.int64) * seqlen_q * seqlen_k  # dS scratch, (B, Hq, Sq, Sk)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)

    args = (K_head, V_head, stride_kn, stride_kd, stride_vn, stride_vd, Bias_head, stride_bm, stride_bn, DBias_head,
            seed, bh, dropout_p)
    if MASK_MOD is not None:  # the block mask's K/V tiles of this Q tile: partial, then full runs
        row = batch * stride_cb + head * stride_ch + block_m
        n_partial = tl.load(KvPartial + row)
        n_visited = tl.load(KvCount + row)
        offset = batch.to(tl.int64) * stride_ib + head.to(tl.int64) * stride_ih + block_m * stride_im
        Idx, Runs = KvIdx + offset, KvRuns + offset
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, *args, n_partial * 0, n_partial, offs_m, offs_d, seqlen_q, seqlen_k, qk_scale,
            softcap, alibi_slope, window_left, window_right, Idx, MaskBuf, ScoreBuf, batch, head, DescK, DescV,
            head_kv, BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS,
            HAS_DROPOUT, HAS_DBIAS, DOT_PRECISION, True, 1, MASK_MOD, SCORE_MOD, SCORE_GRAD, USE_TMA)
        pos = n_partial
        if FULL_RANGE:  # one run per row: see _fwd_kernel
            first = tl.load(Idx + pos, mask=pos < n_visited, other=0)
            dq = _bwd_dq_inner(
                dq, q, do, lse2, delta, *args, first * BLOCK_N, (first + n_visited - pos) * BLOCK_N, offs_m, offs_d,
                seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right, Idx, MaskBuf,
                ScoreBuf, batch, head, DescK, DescV, head_kv, BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED, False, HAS_LEFT,
                HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, HAS_DBIAS, DOT_PRECISION, False, BLOCK_N,
                MASK_MOD, SCORE_MOD, SCORE_GRAD, USE_TMA)
            pos = n_visited
        while pos < n_visited:  # each run of full K/V tiles as a key range: see _fwd_kernel
            first = tl.load(Idx + pos)
            length = tl.load(Runs + pos)
            dq = _bwd_dq_inner(
                dq, q, do, lse2, delta, *args, first * BLOCK_N, (first + length) * BLOCK_N, offs_m, offs_d,
                seqlen_q, seqlen_k, qk_scale, softcap, alibi_slope, window_left, window_right, Idx, MaskBuf,
                ScoreBuf, batch, head, DescK, DescV, head_kv, BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED, False, HAS_LEFT,
                HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, HAS_DBIAS, DOT_PRECISION, False, BLOCK_N,
                MASK_MOD, SCORE_MOD, SCORE_GRAD, USE_TMA)
            pos += length
    else:  # the band's K/V tiles, unrolled at compile time: masked edge, unmasked middle, masked edge
        lo, full_lo, full_hi, hi = _key_tiles(m_lo, m_hi, seqlen_q, seqlen_k, window_left, window_right,
                                              BLOCK_N, HAS_LEFT, HAS_RIGHT)
        for part in tl.static_range(3):
            dq = _bwd_dq_inner(
                dq, q, do, lse2, delta, *args, lo if part == 0 else (full_lo if part == 1 else full_hi),
                full_lo if part == 0 else (full_hi if part == 1 else hi), offs_m, offs_d, seqlen_q, seqlen_k,
                qk_scale, softcap, alibi_slope, window_left, window_right, KvIdx, MaskBuf, ScoreBuf, batch, head,
                DescK, DescV, head_kv, BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED, part != 1, HAS_LEFT, HAS_RIGHT,
                HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, HAS_DBIAS, DOT_PRECISION, False, BLOCK_N, None,
                SCORE_MOD, SCORE_GRAD, USE_TMA)
    dq *= softmax_scale
    tl.store(DQ + batch.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh + rows * stride_dqm
             + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty), mask=mask)
