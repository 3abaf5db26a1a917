"""Minimal Gluon FlashAttention forward for Hopper (sm_90): TMA + mbarrier ring + wgmma.

Non-causal. q, k, v, o: 2-D bf16 tensors of shape (B*H*N, D) (rows of one head are contiguous),
lse: fp32 (B*H, N), natural-log LSE (FA convention).

Structure (no warp specialization; one instruction stream, software-pipelined):
  * Q tile [BLOCK_M, D] loaded once with TMA into shared memory.
  * K and V tiles stream through a NUM_STAGES ring buffer (separate ready barriers for K and
    V so that S = Q K^T can start before V has landed). Tile j lives in slot j % NUM_STAGES and
    its barrier completes phase (j // NUM_STAGES) & 1. The load of tile j + NUM_STAGES - 1 is
    issued at the top of iteration j, into the slot that iteration j - 1 finished with (its
    wgmmas were waited on), so no "empty" barriers are needed in this single-stream design.
  * S = wgmma(Q_smem, K_smem^T) (both operands in shared memory; K^T is a permuted smem view).
  * online softmax with exp2 in the wgmma accumulator layout (NVMMADistributedLayout v3).
  * P -> bf16 -> convert_layout to DotOperandLayout(0, parent=O's accumulator layout, k_width=2),
    O += wgmma(P_regs, V_smem). With BLOCK_N == HEAD_DIM the S and O accumulator layouts are the
    same layout and the conversion is register-local.
  * PIPELINE_QK=True: FA3-style intra-warpgroup overlap: issue S_{j+1} = Q K_{j+1} and
    O += P_j V_j back to back, wait(1) for S_{j+1}, do its softmax while PV_j runs.
  * O stored with a TMA store (when N % BLOCK_M == 0) or a masked pointer store; LSE stored
    with a masked pointer store.
  * attn_fwd_ws_kernel: same math, gl.warp_specialize with a 1-warp TMA loader partition
    (24 regs) and ready/empty mbarrier rings for K and V; the default partition (num_warps=8,
    two consumer warpgroups) computes. Triton sets .maxnreg 168 for the 12-warp CTA and
    setmaxnreg 240 / 24 for the partitions.
  * attn_fwd_pp_kernel: like attn_fwd_ws_kernel but each 64-row consumer warpgroup is its own
    4-warp partition (launch num_warps=4), so the two warpgroups are not lock-stepped by the
    partition-wide bar.sync that precedes every mbarrier.arrive (FA3 "ping-pong" shape, without
    FA3's explicit named-barrier scheduling).

Works with triton 3.6 (tma.async_copy_global_to_shared / async_copy_shared_to_global) and
triton 3.9 (tma.async_load / async_store; the old names raise there): see the aliases below.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# ---- version shims (3.6 <-> 3.9) ---------------------------------------------------------------
# 3.9 renamed the TMA copies; the old names still exist there but raise RuntimeError when traced.
if hasattr(tma, "async_load"):  # triton >= 3.7-ish (3.9 here)
    _tma_load = tma.async_load
    _tma_store = tma.async_store
else:  # triton 3.6
    _tma_load = tma.async_copy_global_to_shared
    _tma_store = tma.async_copy_shared_to_global

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.constexpr_function
def _wgmma_layout(num_warps, instr_n):
    # bf16 wgmma: instr_shape [m=16, n, k=256/16=16]; all warps stacked along M
    # (BLOCK_M=128 with 8 warps: 2 warpgroups, 64 rows each).
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, instr_n, 16])


@gluon.jit
def _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row, j, NUM_STAGES: gl.constexpr, pred):
    slot = j % NUM_STAGES
    kb = k_bars.index(slot)
    vb = v_bars.index(slot)
    mbarrier.expect(kb, k_desc.block_type.nbytes, pred=pred)
    _tma_load(k_desc, [row, 0], kb, k_smem.index(slot), pred)
    mbarrier.expect(vb, v_desc.block_type.nbytes, pred=pred)
    _tma_load(v_desc, [row, 0], vb, v_smem.index(slot), pred)


@gluon.jit
def _softmax_step(s, m_i, l_i, start_n, N_CTX, qk_scale, EVEN_N: gl.constexpr, s_layout: gl.constexpr):
    """s: raw Q K^T tile (fp32, s_layout). Returns p (fp32), alpha, new m, new l (log2 domain)."""
    s = s * qk_scale
    if not EVEN_N:
        # only the last (partial) key block needs the mask; a runtime branch keeps its index math out
        # of the steady-state loop
        if start_n + s.shape[1] > N_CTX:
            cols = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
            s = gl.where((cols < N_CTX)[None, :], s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    p = gl.exp2(s - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def attn_fwd_kernel(q_desc, k_desc, v_desc, o_desc, O, Lse, sm_scale, N_CTX,  #
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,  #
                    NUM_STAGES: gl.constexpr, EVEN_M: gl.constexpr, EVEN_N: gl.constexpr,  #
                    PIPELINE_QK: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(NUM_STAGES >= 2)

    pid_m = gl.program_id(0)
    off_hz = gl.program_id(1)
    row0 = off_hz * N_CTX  # first row of this (batch, head) in the 2-D (B*H*N, D) view
    q_row = row0 + pid_m * BLOCK_M

    # ---- layouts -------------------------------------------------------------------------------
    s_layout: gl.constexpr = _wgmma_layout(num_warps, BLOCK_N)  # S/P accumulator [BLOCK_M, BLOCK_N]
    o_layout: gl.constexpr = _wgmma_layout(num_warps, HEAD_DIM)  # O accumulator [BLOCK_M, HEAD_DIM]
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)  # bf16: 32/16
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)

    # ---- shared memory + barriers --------------------------------------------------------------
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    # Make the barrier inits visible to the async proxy (TMA) before the first copy.
    fence_async_shared()

    n_blocks = gl.cdiv(N_CTX, BLOCK_N)

    # ---- prologue: Q, then the first NUM_STAGES-1 K/V tiles ------------------------------------
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(NUM_STAGES - 1):
        _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row0 + i * BLOCK_N, i, NUM_STAGES, i < n_blocks)

    qk_scale = sm_scale * LOG2E
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=s_row)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=s_row)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bar, 0)

    if PIPELINE_QK:
        # FA3-style: S_{j+1} is computed (async) while softmax of ... overlaps PV_j.
        # Prologue: S_0 and its softmax.
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, N_CTX, qk_scale, EVEN_N, s_layout)
        for j in range(1, n_blocks):
            # refill: tile j + NUM_STAGES - 2 goes into the slot tile j-2 used (its PV is done).
            jn = j + NUM_STAGES - 2
            _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row0 + jn * BLOCK_N, jn, NUM_STAGES,
                      jn < n_blocks)
            slot = j % NUM_STAGES
            phase = (j // NUM_STAGES) & 1
            pslot = (j - 1) % NUM_STAGES
            pphase = ((j - 1) // NUM_STAGES) & 1
            # issue S_j = Q K_j^T
            mbarrier.wait(k_bars.index(slot), phase)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            # issue O += P_{j-1} V_{j-1} (O rescaled by alpha_{j-1} first)
            acc = acc * gl.convert_layout(alpha, o_row, assert_trivial=True)[:, None]
            p16 = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
            mbarrier.wait(v_bars.index(pslot), pphase)
            acc = warpgroup_mma(p16, v_smem.index(pslot), acc, is_async=True)
            # wait for S_j only (PV_{j-1} may still run) and do its softmax meanwhile
            s = warpgroup_mma_wait(1, deps=(s, ))
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, N_CTX, qk_scale, EVEN_N, s_layout)
            acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
        # epilogue: last PV
        last = n_blocks - 1
        acc = acc * gl.convert_layout(alpha, o_row, assert_trivial=True)[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
        mbarrier.wait(v_bars.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
        acc = warpgroup_mma(p16, v_smem.index(last % NUM_STAGES), acc, is_async=True)
        acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
    else:
        for j in range(n_blocks):
            # prefetch tile j + NUM_STAGES - 1 into the slot tile j - 1 used (already consumed)
            jn = j + NUM_STAGES - 1
            _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row0 + jn * BLOCK_N, jn, NUM_STAGES,
                      jn < n_blocks)
            slot = j % NUM_STAGES
            phase = (j // NUM_STAGES) & 1
            mbarrier.wait(k_bars.index(slot), phase)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s, ))
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, N_CTX, qk_scale, EVEN_N, s_layout)
            acc = acc * gl.convert_layout(alpha, o_row, assert_trivial=True)[:, None]
            p16 = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
            mbarrier.wait(v_bars.index(slot), phase)
            acc = warpgroup_mma(p16, v_smem.index(slot), acc, is_async=True)
            acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    # ---- epilogue: O = acc / l, LSE = (m + log2 l) * ln2 ---------------------------------------
    l_o = gl.convert_layout(l_i, o_row)
    out = (acc * (1.0 / l_o)[:, None]).to(dtype)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=s_row)
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(Lse + off_hz * N_CTX + offs_m, lse, mask=offs_m < N_CTX)
    if EVEN_M:
        o_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], o_desc.layout)
        o_smem.store(out)
        fence_async_shared()
        _tma_store(o_desc, [q_row, 0], o_smem)
        tma.store_wait(0)
    else:
        om = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=o_row)
        od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        ptrs = O + (row0 + om)[:, None].to(gl.int64) * HEAD_DIM + od[None, :]
        gl.store(ptrs, out, mask=(om < N_CTX)[:, None])


# ---- warp-specialized variant ---------------------------------------------------------------------
# Default partition (num_warps warps, 2 consumer warpgroups for BLOCK_M=128 / num_warps=8) does
# the wgmmas + softmax + epilogue; one 1-warp worker partition issues every TMA load. K and V have
# their own ready/empty barrier rings; "empty" is arrived on by the consumer once the wgmma that
# read the slot has been waited on.
@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,  #
               q_row, row0, n_blocks, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        row = row0 + j * BLOCK_N
        # a fresh mbarrier has "completed" the phase before phase 0, so waiting on phase^1 passes
        # the first time round the ring
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [row, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [row, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _ws_consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, O, Lse, sm_scale,  #
                 N_CTX, pid_m, off_hz, row0, q_row, n_blocks,  #
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                 EVEN_M: gl.constexpr, EVEN_N: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _wgmma_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = _wgmma_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)

    qk_scale = sm_scale * LOG2E
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=s_row)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=s_row)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bar, 0)
    # S_0 and its softmax
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, N_CTX, qk_scale, EVEN_N, s_layout)
    for j in range(1, n_blocks):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        pslot = (j - 1) % NUM_STAGES
        pphase = ((j - 1) // NUM_STAGES) & 1
        mbarrier.wait(k_ready.index(slot), phase)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = acc * gl.convert_layout(alpha, o_row, assert_trivial=True)[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
        mbarrier.wait(v_ready.index(pslot), pphase)
        acc = warpgroup_mma(p16, v_smem.index(pslot), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s, ))
        mbarrier.arrive(k_empty.index(slot), count=1)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, N_CTX, qk_scale, EVEN_N, s_layout)
        acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
        mbarrier.arrive(v_empty.index(pslot), count=1)
    last = n_blocks - 1
    acc = acc * gl.convert_layout(alpha, o_row, assert_trivial=True)[:, None]
    p16 = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
    mbarrier.wait(v_ready.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
    acc = warpgroup_mma(p16, v_smem.index(last % NUM_STAGES), acc, is_async=True)
    acc, p16 = warpgroup_mma_wait(0, deps=(acc, p16))
    mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)

    l_o = gl.convert_layout(l_i, o_row)
    out = (acc * (1.0 / l_o)[:, None]).to(dtype)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=s_row)
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(Lse + off_hz * N_CTX + offs_m, lse, mask=offs_m < N_CTX)
    if EVEN_M:
        # Q is dead once the last S wgmma retired: reuse its buffer for O.
        q_smem.store(out)
        fence_async_shared()
        _tma_store(o_desc, [q_row, 0], q_smem)
        tma.store_wait(0)
    else:
        om = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=o_row)
        od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        ptrs = O + (row0 + om)[:, None].to(gl.int64) * HEAD_DIM + od[None, :]
        gl.store(ptrs, out, mask=(om < N_CTX)[:, None])


@gluon.jit
def attn_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, O, Lse, sm_scale, N_CTX,  #
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,  #
                       NUM_STAGES: gl.constexpr, EVEN_M: gl.constexpr, EVEN_N: gl.constexpr,  #
                       LOADER_REGS: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.program_id(0)
    off_hz = gl.program_id(1)
    row0 = off_hz * N_CTX
    q_row = row0 + pid_m * BLOCK_M
    n_blocks = gl.cdiv(N_CTX, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=1)
    fence_async_shared()

    gl.warp_specialize([
        (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, O, Lse, sm_scale,
                        N_CTX, pid_m, off_hz, row0, q_row, n_blocks, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, EVEN_M,
                        EVEN_N, num_warps)),
        (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row,
                      row0, n_blocks, BLOCK_N, NUM_STAGES)),
    ], [1], [LOADER_REGS])


# ---- warp-specialized, one partition per consumer warpgroup ("ping-pong" shape of FA3) -------------
# In attn_fwd_ws_kernel both consumer warpgroups live in ONE partition, and every mbarrier.arrive
# there is lowered as `bar.sync 0, 256` + a single-thread arrive, which keeps the two warpgroups in
# lock-step. Here each 64-row half of the 128-row Q tile gets its own 4-warp partition (the default
# partition and one worker run the same function), so the warpgroups only meet on the K/V "empty"
# barriers (count=2: one arrival per warpgroup) and the warp schedulers can overlap one warpgroup's
# softmax with the other's wgmmas.
@gluon.jit
def _pp_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,  #
               q_row, row0, n_blocks, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    _tma_load(q_desc, [q_row + q_desc.block_type.shape[0], 0], q_bar, q_smem.index(1))
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        row = row0 + j * BLOCK_N
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [row, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [row, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _pp_consumer(WG: gl.constexpr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, O, Lse,
                 sm_scale, N_CTX, pid_m, off_hz, row0, q_row, n_blocks,  #
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                 EVEN_M: gl.constexpr, EVEN_N: gl.constexpr):
    # BLOCK_M here is the warpgroup's share (64 rows); this partition has 4 warps.
    _ws_consumer(q_smem.index(WG), k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, O, Lse,
                 sm_scale, N_CTX, pid_m * 2 + WG, off_hz, row0, q_row + WG * BLOCK_M, n_blocks, HEAD_DIM, BLOCK_M,
                 BLOCK_N, NUM_STAGES, EVEN_M, EVEN_N, 4)


@gluon.jit
def attn_fwd_pp_kernel(q_desc, k_desc, v_desc, o_desc, O, Lse, sm_scale, N_CTX,  #
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,  #
                       NUM_STAGES: gl.constexpr, EVEN_M: gl.constexpr, EVEN_N: gl.constexpr,  #
                       LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """BLOCK_M: rows per CTA (128 = 2 warpgroups x 64). q_desc / o_desc blocks are [BLOCK_M // 2, HEAD_DIM].
    Launch with num_warps=4 (the default partition is consumer warpgroup 0)."""
    gl.static_assert(num_warps == 4)
    dtype: gl.constexpr = q_desc.dtype
    HALF_M: gl.constexpr = BLOCK_M // 2
    pid_m = gl.program_id(0)
    off_hz = gl.program_id(1)
    row0 = off_hz * N_CTX
    q_row = row0 + pid_m * BLOCK_M
    n_blocks = gl.cdiv(N_CTX, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()

    # (tuple concatenation like (0, ) + cargs does not trace here: spell the argument tuples out)
    gl.warp_specialize([
        (_pp_consumer, (0, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, O, Lse, sm_scale,
                        N_CTX, pid_m, off_hz, row0, q_row, n_blocks, HEAD_DIM, HALF_M, BLOCK_N, NUM_STAGES, EVEN_M,
                        EVEN_N)),
        (_pp_consumer, (1, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, O, Lse, sm_scale,
                        N_CTX, pid_m, off_hz, row0, q_row, n_blocks, HEAD_DIM, HALF_M, BLOCK_N, NUM_STAGES, EVEN_M,
                        EVEN_N)),
        (_pp_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row,
                      row0, n_blocks, BLOCK_N, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# ---- host side -----------------------------------------------------------------------------------
def attn_fwd(q, k, v, sm_scale, N_CTX, BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, PIPELINE_QK=True, num_warps=8,
             WS=False, PP=False, LOADER_REGS=24, CONSUMER_REGS=240):
    """q, k, v: (B*H*N, D) contiguous bf16 CUDA tensors. Returns o (same shape), lse (B*H, N) fp32.
    WS=True: the warp-specialized kernel (1 loader warp + num_warps consumer warps; PIPELINE_QK implied).
    PP=True: one 4-warp partition per 64-row consumer warpgroup + 1 loader warp (num_warps forced to 4)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows, D = q.shape
    BH = rows // N_CTX
    o = torch.empty_like(q)
    lse = torch.empty((BH, N_CTX), device=q.device, dtype=torch.float32)
    QM = BLOCK_M // 2 if PP else BLOCK_M  # rows per Q / O TMA box
    lay_m = gl.NVMMASharedLayout.get_default_for([QM, D], gl.bfloat16)
    lay_n = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.bfloat16)
    q_desc = TensorDescriptor.from_tensor(q, [QM, D], lay_m)
    k_desc = TensorDescriptor.from_tensor(k, [BLOCK_N, D], lay_n)
    v_desc = TensorDescriptor.from_tensor(v, [BLOCK_N, D], lay_n)
    o_desc = TensorDescriptor.from_tensor(o, [QM, D], lay_m)
    grid = (triton.cdiv(N_CTX, BLOCK_M), BH)
    if PP:  # EVEN_M must hold per CTA (128 rows), or the second warpgroup's TMA store would hit the next head
        attn_fwd_pp_kernel[grid](q_desc, k_desc, v_desc, o_desc, o, lse, sm_scale, N_CTX,  #
                                 D, BLOCK_M, BLOCK_N, NUM_STAGES, N_CTX % BLOCK_M == 0, N_CTX % BLOCK_N == 0,  #
                                 LOADER_REGS, CONSUMER_REGS, num_warps=4)
        return o, lse
    if WS:
        attn_fwd_ws_kernel[grid](q_desc, k_desc, v_desc, o_desc, o, lse, sm_scale, N_CTX,  #
                                 D, BLOCK_M, BLOCK_N, NUM_STAGES, N_CTX % BLOCK_M == 0, N_CTX % BLOCK_N == 0,  #
                                 LOADER_REGS, num_warps=num_warps)
        return o, lse
    attn_fwd_kernel[grid](q_desc, k_desc, v_desc, o_desc, o, lse, sm_scale, N_CTX,  #
                          D, BLOCK_M, BLOCK_N, NUM_STAGES, N_CTX % BLOCK_M == 0, N_CTX % BLOCK_N == 0,  #
                          PIPELINE_QK, num_warps=num_warps)
    return o, lse


def reference(q, k, v, sm_scale, N_CTX):
    import torch
    D = q.shape[1]
    qf, kf, vf = (t.float().view(-1, N_CTX, D) for t in (q, k, v))
    s = qf @ kf.transpose(1, 2) * sm_scale
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ vf
    return o.to(q.dtype).view(-1, D), lse


if __name__ == "__main__":  # GPU test
    import torch
    torch.manual_seed(0)
    for (B, H, N, D) in [(2, 4, 1024, 128), (1, 3, 1000, 128), (2, 2, 4096, 128)]:
        q, k, v = (torch.randn(B * H * N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for cfg in [dict(BLOCK_N=128, NUM_STAGES=2), dict(BLOCK_N=128, NUM_STAGES=3), dict(BLOCK_N=64, NUM_STAGES=3),
                    dict(BLOCK_N=128, NUM_STAGES=2, PIPELINE_QK=False), dict(WS=True, BLOCK_N=128, NUM_STAGES=2),
                    dict(WS=True, BLOCK_N=128, NUM_STAGES=3), dict(WS=True, BLOCK_N=64, NUM_STAGES=4),
                    dict(PP=True, BLOCK_N=128, NUM_STAGES=2), dict(PP=True, BLOCK_N=128, NUM_STAGES=3)]:
            o, lse = attn_fwd(q, k, v, D**-0.5, N, **cfg)
            ro, rlse = reference(q, k, v, D**-0.5, N)
            print(B, H, N, D, cfg, "max|do|", (o.float() - ro.float()).abs().max().item(), "max|dlse|",
                  (lse - rlse).abs().max().item())
