"""A Gluon Hopper backward with five products per tile pair: dQ summed from the dK/dV kernel.

A probe (not wired into flashtile): compiled for sm_90 on the CPU (``compile.py``), checked and
timed on a GPU (``check.py``). The library's Gluon backward (src/flashtile/kernels/gluon_bwd.py)
runs two kernels with seven products per (Q tile, key tile): dK/dV (S, dP, dV, dK) and dQ (S,
dP again, dQ). Both run near the matmul rate (docs/performance.md, session 9), so the way past
cuDNN is FlashAttention-3's: one kernel, five products, dQ accumulated in float32.

Per CTA (128 keys of one kv head; a consumer warpgroup per 64 keys, one loader warp, the
library's ``_dkdv_loader``), per streamed Q tile of 64 rows, each warpgroup computes as the
library's dK/dV kernel does

    S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T·qk_scale − lse2), dV += P^T dO,
    dS^T = P^T ∘ (dP^T − Delta), dK += dS^T Q,

then stores dS^T (bf16) into its 64 rows of a shared (128 keys × 64 queries) buffer. The two
warpgroups meet at an mbarrier (count 2), after which each computes half of the Q tile's dQ
columns over all 128 keys,

    dQ[:, cols of half h] = dS (64 × 128, the buffer read transposed) · K[:, cols of half h],

and adds it (float32, relaxed atomics) into a (B·Hq, S_pad, D) float32 buffer. Splitting by
columns rather than by keys halves the atomics' traffic (each element of dQ is added once per
128 keys, FA2's amount) and keeps the partial in 32 registers per thread instead of 64, beside
dK and dV's 128. The buffer of dS is double-buffered: a warpgroup waits for its own dQ product
before it arrives at the next tile's barrier, so once both have arrived at tile i + 1 neither
still reads tile i's buffer, and tile i + 2 may overwrite it.

Causal tiles that a warpgroup skips (its keys all after the tile's last query) store zeros so
that the other warpgroup's dQ product reads a defined dS. A small Triton kernel turns the float32
sum into dq (× softmax_scale, q's dtype) afterwards.

``DQ_BY_TMA`` (Triton 3.8 and newer, whose Gluon has ``tma.async_atomic_add``) adds each
warpgroup's dQ half as FlashAttention-3 does: staged in shared memory (64 × HALF_D float32,
one buffer per warpgroup) and added by one TMA bulk reduction into the float32 sum, through a
descriptor over it, instead of 32 vector atomics per thread. Session 11 wrote it; it has been
compiled for sm_90 (Triton 3.9), not run: Triton 3.6, the GPU image's, has no TMA reduction
(tools/triton_parts.sh carries 3.9 there).
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "..", "src"), os.path.join(HERE, "..", "gluon_bwd")]
from flashtile.kernels.gluon_bwd import _dkdv_loader  # noqa: E402
from flashtile.kernels.gluon_common import accumulator_layout, key_tile_of_program, tma_store  # noqa: E402


# Triton 3.6 calls the barrier of a partition's threads thread_barrier, 3.9 barrier.
partition_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _consumer(half: gl.constexpr, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage,
              kv_ready, q_ready, do_ready, empty, ds_full, dk_desc, dv_desc, DQacc,
              batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad,
              qk_scale, softmax_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr, NUM_STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, DQ_BY_TMA: gl.constexpr):
    """One warpgroup: dK, dV of keys [n_start + half·HALF_N, +HALF_N); dQ columns
    [half·HEAD_DIM/2, +HEAD_DIM/2) of every streamed Q tile, over the CTA's 2·HALF_N keys.
    DQacc: the float32 sum's pointer, or under DQ_BY_TMA a descriptor over it as
    (B·Hq·S_pad, HEAD_DIM) with (BLOCK_M, HEAD_DIM / 2) boxes; dq_stage: that box in shared
    memory, this warpgroup's (unused without DQ_BY_TMA)."""
    HALF_D: gl.constexpr = HEAD_DIM // 2
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_M)  # S^T, dP^T: HALF_N keys x BLOCK_M queries
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)  # dK, dV: HALF_N x HEAD_DIM
    dq_layout: gl.constexpr = accumulator_layout(4, HALF_D)  # dQ half: BLOCK_M x HALF_D
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = k_smem.dtype

    key_first = n_start + half * HALF_N
    keys = key_first + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
    shift = seqlen_k - seqlen_q
    k_tile = k_smem.index(half).reshape([HALF_N, HEAD_DIM])
    v_tile = v_smem.index(half).reshape([HALF_N, HEAD_DIM])
    # This warpgroup's dQ columns of each key half. Not one (2·HALF_N)-row view of both halves:
    # at d128 a half's 128 columns are two 64-column swizzle blocks stored one after the other
    # (TMA's 128-byte swizzle), so the halves do not stack into one 128-row tile (the GPU check
    # of that view: d64 right, d128's dQ wrong); one product per key half instead.
    k_cols0 = k_smem.index(0).reshape([HALF_N, HEAD_DIM]).slice(half * HALF_D, HALF_D, dim=1)
    k_cols1 = k_smem.index(1).reshape([HALF_N, HEAD_DIM]).slice(half * HALF_D, HALF_D, dim=1)
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=kv_layout)
    s_zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([BLOCK_M, HALF_D], gl.float32, layout=dq_layout)
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols = half * HALF_D + gl.arange(0, HALF_D, layout=gl.SliceLayout(0, dq_layout))

    mbarrier.wait(kv_ready.index(0), 0)  # dQ reads both key halves
    mbarrier.wait(kv_ready.index(1), 0)
    total = group_size * n_q_tiles
    for it in range(total):
        g = it // n_q_tiles
        m_start = (first_tile + it - g * n_q_tiles) * BLOCK_M
        slot = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        buffer = it % 2
        q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        ds_half = ds_smem.index(buffer).slice(half * HALF_N, HALF_N, dim=0)  # HALF_N keys x BLOCK_M
        mbarrier.wait(q_ready.index(slot), phase)
        mbarrier.wait(do_ready.index(slot), phase)
        run = True
        if CAUSAL:
            run = key_first <= m_start + BLOCK_M - 1 + shift
        if run:
            s = warpgroup_mma(k_tile, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(v_tile, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            lse2 = lse_smem.index(slot).reshape([BLOCK_M]).load(col_layout)
            s = s * qk_scale - lse2[None, :]
            if CAUSAL:
                if key_first + HALF_N - 1 > m_start + shift:
                    queries = m_start + gl.arange(0, BLOCK_M, layout=col_layout)
                    s = gl.where(keys[:, None] <= (queries + shift)[None, :], s, -float("inf"))
            p = gl.exp2(s)
            p16 = gl.convert_layout(p.to(dtype), a_layout, assert_trivial=True)
            dv = warpgroup_mma(p16, do_tile, dv, is_async=True)
            dp = warpgroup_mma_wait(1, deps=(dp, ))
            delta = delta_smem.index(slot).reshape([BLOCK_M]).load(col_layout)
            ds = (p * (dp - delta[None, :])).to(dtype)
            ds_half.store(ds)
            ds16 = gl.convert_layout(ds, a_layout, assert_trivial=True)
            dk = warpgroup_mma(ds16, q_tile, dk, is_async=True)
            # (retired inside the branch: an async result may not leave an `if`)
            dv, dk, p16, ds16 = warpgroup_mma_wait(0, deps=(dv, dk, p16, ds16))
        else:
            ds_half.store(s_zero.to(dtype))
        # dS^T visible to the async proxy (wgmma), and this warpgroup's stores all done, before
        # the other warpgroup may read them.
        fence_async_shared()
        partition_barrier()
        mbarrier.arrive(ds_full.index(buffer), count=1)
        mbarrier.wait(ds_full.index(buffer), (it // 2) & 1)
        ds_all = ds_smem.index(buffer)  # 2·HALF_N keys x BLOCK_M queries; dS = its transpose
        dq = warpgroup_mma(ds_all.slice(0, HALF_N, dim=0).permute((1, 0)), k_cols0, dq_zero, use_acc=False,
                           is_async=True)
        dq = warpgroup_mma(ds_all.slice(HALF_N, HALF_N, dim=0).permute((1, 0)), k_cols1, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        mbarrier.arrive(empty.index(slot), count=1)
        # Rows past the sequence have dS = 0 (lse2 = +inf there) and land in the padding rows.
        head = head_kv * group_size + g
        if DQ_BY_TMA:
            # The previous tile's reduction must have read the staging buffer; then every
            # thread's part of this one stored and visible to the TMA unit before it is issued.
            tma.store_wait(0)
            dq_stage.store(dq)
            fence_async_shared()
            partition_barrier()
            tma.async_atomic_add(DQacc, [(batch * heads_q + head) * s_pad + m_start, half * HALF_D], dq_stage)
        else:
            row0 = (batch * heads_q + head).to(gl.int64) * s_pad + m_start
            offsets = (row0 + dq_rows)[:, None] * HEAD_DIM + dq_cols[None, :]
            gl.atomic_add(DQacc + offsets, dq, sem="relaxed")

    k_tile.store((dk * softmax_scale).to(dtype))
    v_tile.store(dv.to(dtype))
    fence_async_shared()
    tma_store(dk_desc, [batch, head_kv, key_first, 0], k_smem.index(half))
    tma_store(dv_desc, [batch, head_kv, key_first, 0], v_smem.index(half))
    tma.store_wait(0)


@gluon.jit
def _dkdv_dq_kernel(
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc, DQacc,
    heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, s_pad, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
    DQ_BY_TMA: gl.constexpr = False,
):
    """dK, dV (B, Hkv, Sk, D) of one BLOCK_N-key tile of one kv head, and its share of dQ added
    into DQacc ((B·Hq·S_pad, D) float32, zeroed; under DQ_BY_TMA a descriptor over it with
    (BLOCK_M, D / 2) boxes). Grid and other descriptors as gluon_bwd._dkdv_kernel."""
    gl.static_assert(num_warps == 4)
    HALF_N: gl.constexpr = BLOCK_N // 2
    dtype: gl.constexpr = q_desc.dtype
    batch, head_kv, n_start, first_tile, n_q_tiles, n_q_blocks = key_tile_of_program(
        gl.program_id(0), num_n_blocks, heads_kv, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)

    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, HALF_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, HALF_N, HEAD_DIM], v_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, BLOCK_M], delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    if DQ_BY_TMA:  # one staging box per warpgroup
        dq_stage = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], DQacc.layout)
    else:
        dq_stage = gl.allocate_shared_memory(gl.float32, [2, 1, 1],
                                             gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(ds_full.index(i), count=2)  # one arrival per consumer warpgroup
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (0, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage.index(0),
                     kv_ready, q_ready, do_ready, empty, ds_full, dk_desc, dv_desc, DQacc, batch, head_kv, n_start,
                     seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad, qk_scale, softmax_scale,
                     HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, DQ_BY_TMA)),
        (_consumer, (1, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage.index(1),
                     kv_ready, q_ready, do_ready, empty, ds_full, dk_desc, dv_desc, DQacc, batch, head_kv, n_start,
                     seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad, qk_scale, softmax_scale,
                     HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, DQ_BY_TMA)),
        (_dkdv_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                        lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty, batch, head_kv, n_start, heads_q,
                        group_size, first_tile, n_q_tiles, n_q_blocks, HALF_N, BLOCK_M, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


@triton.jit
def _dq_convert(DQacc, DQ, stride_qb, stride_qh, stride_qm, heads_q, seqlen_q, s_pad, softmax_scale,
                HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """dq (B, Hq, Sq, D) view = softmax_scale · DQacc rows, in dq's dtype."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    inside = (rows < seqlen_q)[:, None]
    acc = tl.load(DQacc + (bh.to(tl.int64) * s_pad + rows)[:, None] * HEAD_DIM + cols[None, :], mask=inside)
    batch = bh // heads_q
    head = bh % heads_q
    out = DQ + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + rows[:, None].to(tl.int64) * stride_qm
    tl.store(out + cols[None, :], (acc * softmax_scale).to(DQ.dtype.element_ty), mask=inside)


def backward(q, k, v, out, dout, lse, softmax_scale: float, causal: bool, stages: int = 2, dq_by_tma: bool = False):
    """(dq, dk, dv) of attention; q/out/dout (B, Hq, Sq, D), k/v (B, Hkv, Sk, D), D = 128 or 64,
    bf16/fp16, lse (B, Hq, Sq) natural log. Preprocessing and descriptors: the gluon_bwd probe's.
    ``dq_by_tma``: dQ added by TMA bulk reductions (Triton 3.8+; B·Hq·S_pad < 2³¹ rows)."""
    from hopper_bwd import LOG2E, _descriptor, _stats_descriptor, preprocess

    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    lse2, delta = preprocess(out, dout, lse, heads_q, seqlen_q)
    s_pad = lse2.shape[1]
    dq_acc = torch.zeros(batch * heads_q * s_pad, head_dim, dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_m, block_n = 64, 128
    dq_target = dq_acc
    if dq_by_tma:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        box = [block_m, head_dim // 2]
        dq_target = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), box,
                                     gl.NVMMASharedLayout.get_default_for(box, gl.float32))
    num_n_blocks = triton.cdiv(seqlen_k, block_n)
    _dkdv_dq_kernel[(num_n_blocks * batch * heads_kv,)](
        _descriptor(q, block_m), _descriptor(dout, block_m), _descriptor(k, block_n // 2),
        _descriptor(v, block_n // 2), _descriptor(dk, block_n // 2), _descriptor(dv, block_n // 2),
        _stats_descriptor(lse2, block_m), _stats_descriptor(delta, block_m), dq_target,
        heads_q, heads_kv, heads_q // heads_kv, seqlen_q, seqlen_k, num_n_blocks, s_pad,
        softmax_scale * LOG2E, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal,
        LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4, DQ_BY_TMA=dq_by_tma,
    )
    block = 64
    _dq_convert[(triton.cdiv(seqlen_q, block), batch * heads_q)](
        dq_acc, dq, dq.stride(0), dq.stride(1), dq.stride(2), heads_q, seqlen_q, s_pad, softmax_scale,
        HEAD_DIM=head_dim, BLOCK=block)
    return dq, dk, dv
