"""Hopper (sm_90) backward in Gluon with five products per tile pair: dQ summed by the dK/dV kernel.

gluon_bwd.py's backward runs two kernels with seven products per (Q tile, key tile): dK/dV
(Sᵀ, dPᵀ, dV, dK) and dQ (S, dP again, dQ). Both run near the matmul rate, so fewer products is
the way further (FlashAttention-3's): one kernel computes dK and dV as gluon_bwd's does and
also each Q tile's share of dQ from the same dS, adding it into a float32 sum by a TMA bulk
reduction. Gluon has that reduction (``tma.async_atomic_add``) from Triton 3.8 on; with an older
Triton the kernel issues a TMA store of the same box, which tma_reduce_ptx.py rewrites into the
reduction in the PTX (gluon_common.tma_reduce_add).

Per CTA (128 keys of one kv head): two consumer warpgroups of 64 keys each and one loader warp
(gluon_bwd's ``_dkdv_loader``: K and V halves once, then (Q, lse2) and (dO, Delta) tiles of
BLOCK_M rows through a ring, over every query head of the GQA group). Per streamed Q tile each
warpgroup computes, as gluon_bwd's dK/dV consumer,

    Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp2(Sᵀ·qk_scale − lse2), dV += Pᵀ dO,
    dSᵀ = Pᵀ ∘ (dPᵀ − Delta), dK += dSᵀ Q,

and stores its dSᵀ (q's dtype) into its 64 rows of a shared (128 keys × BLOCK_M) buffer. The two
meet at an mbarrier (count 2); then each computes half of the tile's dQ columns over all 128
keys,

    dQ[:, columns of half h] = dS · K[:, columns of half h]   (dS: the buffer read transposed),

stages it in shared memory and adds it with one TMA reduction into a (B·Hq·S_pad, D) float32
buffer. Splitting dQ by columns rather than by keys adds each element once per 128 keys and keeps
the partial at 32 registers per thread beside dK's and dV's 128. The dS buffer is doubled: a
warpgroup waits for its own dQ product before it arrives at the next tile's barrier, so once both
have arrived at tile i + 1 neither reads tile i's buffer any more and tile i + 2 may overwrite it.
Causal tiles a warpgroup skips (all its keys after the tile's last query) store zeros there, so
the other warpgroup's dQ product reads a defined dS. ``_dq_convert`` (Triton) then writes
dq = softmax_scale · sum in q's dtype.

dQ is added in the order the CTAs reach it, so its last bits can differ between runs (as in
FlashAttention-2 and 3's default backward); kernels/hopper.py takes the seven-product kernels,
whose every output has one writer, when the caller asks for a deterministic backward.

Conventions (views, the lse2/Delta buffers, bottom-right causal, padding rows) are gluon_bwd.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from . import tma_reduce_ptx
from .gluon_bwd import _dkdv_loader, _dkdv_tile, _dkdv_tile_issued, load_kv_halves, store_dkdv
from .gluon_common import (accumulator_layout, init_q_ring_barriers, key_tile_of_program, partition_barrier,
                           q_ring_barriers, q_ring_buffers, q_tile_start, read_slot, reinterpret_shared,
                           stream_q_tiles, tma_reduce_add, tma_store, write_slot)


@gluon.jit
def _dq_product(ds_smem, ds_full, buffer, i, k_cols0, k_cols1, dq_zero, HALF_N: gl.constexpr):
    """Step ``i``'s dQ half, issued, not waited for: this warpgroup's dSᵀ (stored by all its
    threads into dS buffer ``buffer``) made visible to wgmma (the async proxy), the two
    warpgroups met at the buffer's ds_full barrier, then dS (the buffer read transposed: BLOCK_M
    queries × 2·HALF_N keys) times this warpgroup's columns of each key half."""
    fence_async_shared()
    partition_barrier()
    mbarrier.arrive(ds_full.index(buffer), count=1)
    mbarrier.wait(ds_full.index(buffer), (i // 2) & 1)
    ds_all = ds_smem.index(buffer)
    dq = warpgroup_mma(ds_all.slice(0, HALF_N, dim=0).permute((1, 0)), k_cols0, dq_zero, use_acc=False,
                       is_async=True)
    return warpgroup_mma(ds_all.slice(HALF_N, HALF_N, dim=0).permute((1, 0)), k_cols1, dq, is_async=True)


@gluon.jit
def _key_tile_steps(half: gl.constexpr, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage,
                    kv_ready, q_ready, do_ready, empty, ds_full, dq_acc_desc,
                    batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad,
                    qk_scale, step_begin, n_steps, ring, meet, kv_phase,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                    CAUSAL: gl.constexpr, REDUCE_BY_PTX: gl.constexpr, Q_DESCENDING: gl.constexpr,
                    EXP_POLY: gl.constexpr, HOIST_STATS: gl.constexpr, DEFER_DK: gl.constexpr,
                    END_MEETING: gl.constexpr = True):
    """One warpgroup's steps over one key tile: dK, dV of keys [n_start + half·HALF_N, +HALF_N)
    (returned as (dk, dv, steps, the first key), dk and dv float32 HALF_N × HEAD_DIM) and dQ columns
    [half·HEAD_DIM/2, +HEAD_DIM/2) of every streamed Q tile over the tile's 2·HALF_N keys, staged
    in ``dq_stage`` (BLOCK_M × HEAD_DIM/2 float32, this warpgroup's) and added through
    ``dq_acc_desc`` (the float32 sum as (B·Hq·S_pad, HEAD_DIM), boxes of that size); returns once
    both warpgroups have met after their last dQ product, so that K's halves are read by no
    product any more.
    With ``n_steps`` (not None), steps step_begin.. +n_steps of the program's (query head, Q
    tile) sequence only (the kernel's TAIL_SPLIT). ``ring``, ``meet``, ``kv_phase``: what went
    before in this program (0 for a program's one key tile; a persistent program's earlier key
    tiles): the Q-side tiles sent round the ring, the two warpgroups' meetings at the ds_full
    barriers (one a step and one after a tile's last), and the phase of kv_ready that this tile's
    K and V complete. EXP_POLY: how many of every 4 exponentials a polynomial computes
    (exp2_split.py). Without END_MEETING (a persistent program whose K and V go back to the loader
    only through kv_empty, both warpgroups' arrivals) the steps return without that last meeting."""
    HALF_D: gl.constexpr = HEAD_DIM // 2
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_M)  # Sᵀ, dPᵀ: HALF_N keys × BLOCK_M queries
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)  # dK, dV: HALF_N × HEAD_DIM
    dq_layout: gl.constexpr = accumulator_layout(4, HALF_D)  # a dQ half: BLOCK_M × HALF_D
    dtype: gl.constexpr = k_smem.dtype

    key_first = n_start + half * HALF_N
    keys = key_first + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
    shift = seqlen_k - seqlen_q
    k_tile = k_smem.index(half).reshape([HALF_N, HEAD_DIM])
    v_tile = v_smem.index(half).reshape([HALF_N, HEAD_DIM])
    # This warpgroup's dQ columns of each key half, one product per half: at d128 a half's 128
    # columns are two 64-column swizzle blocks one after the other (TMA's 128-byte swizzle), so
    # the two halves do not stack into one 128-row operand.
    k_cols0 = k_smem.index(0).reshape([HALF_N, HEAD_DIM]).slice(half * HALF_D, HALF_D, dim=1)
    k_cols1 = k_smem.index(1).reshape([HALF_N, HEAD_DIM]).slice(half * HALF_D, HALF_D, dim=1)
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=kv_layout)
    s_zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([BLOCK_M, HALF_D], gl.float32, layout=dq_layout)

    mbarrier.wait(kv_ready.index(0), kv_phase)  # dQ reads both key halves
    mbarrier.wait(kv_ready.index(1), kv_phase)
    if n_steps is None:
        count = group_size * n_q_tiles
    else:
        count = n_steps
    for i in range(count):
        # the sequence's step; the ring and the dS buffers count the program's steps
        if n_steps is None:
            it = i
        else:
            it = step_begin + i
        g = it // n_q_tiles
        m_start = q_tile_start(it - g * n_q_tiles, first_tile, n_q_tiles, BLOCK_M, Q_DESCENDING)
        slot = (ring + i) % NUM_STAGES
        phase = ((ring + i) // NUM_STAGES) & 1
        buffer = (meet + i) % 2
        q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        ds_half = ds_smem.index(buffer).slice(half * HALF_N, HALF_N, dim=0)  # HALF_N keys × BLOCK_M
        mbarrier.wait(q_ready.index(slot), phase)
        mbarrier.wait(do_ready.index(slot), phase)
        if DEFER_DK:
            # dK's product (and dV's) left in flight through the meeting and the dQ product, and
            # waited for with dQ's: the tensor cores run it while this warpgroup fences and waits.
            # Every step runs, a causal one whose queries all precede this warpgroup's keys too (the
            # mask then hides all of Sᵀ and its dSᵀ is zeros): with the skip's branch around products
            # in flight, causal dQ failed the oracle on the H200 (session 26; cause not pinned down).
            dk, dv, p16, ds16 = _dkdv_tile_issued(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv,
                                                  s_zero, keys, key_first, m_start, shift, qk_scale, ds_half, HALF_N,
                                                  BLOCK_M, HEAD_DIM, CAUSAL, True, EXP_POLY=EXP_POLY,
                                                  HOIST_STATS=HOIST_STATS)
            dq = _dq_product(ds_smem, ds_full, buffer, meet + i, k_cols0, k_cols1, dq_zero, HALF_N)
            dq, dk, dv, p16, ds16 = warpgroup_mma_wait(0, deps=(dq, dk, dv, p16, ds16))
        else:
            run = True
            if CAUSAL:  # some query of the tile sees this warpgroup's first key
                run = key_first <= m_start + BLOCK_M - 1 + shift
            if run:  # gluon_bwd's step, dSᵀ also stored for the dQ product below
                dk, dv = _dkdv_tile(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv, s_zero, keys,
                                    key_first, m_start, shift, qk_scale, ds_half, HALF_N, BLOCK_M, HEAD_DIM, CAUSAL,
                                    True, EXP_POLY=EXP_POLY, HOIST_STATS=HOIST_STATS)
            else:
                ds_half.store(s_zero.to(dtype))
            dq = _dq_product(ds_smem, ds_full, buffer, meet + i, k_cols0, k_cols1, dq_zero, HALF_N)
            dq = warpgroup_mma_wait(0, deps=(dq, ))
        mbarrier.arrive(empty.index(slot), count=1)
        # The previous tile's reduction must have read the staging box; then every thread's part
        # of this one stored and visible to the TMA unit before the reduction is issued. Rows past
        # the sequence have dS = 0 (lse2 = +inf there) and land in the sum's padding rows.
        tma.store_wait(0)
        dq_stage.store(dq)
        fence_async_shared()
        partition_barrier()
        row = (batch * heads_q + head_kv * group_size + g) * s_pad + m_start
        tma_reduce_add(dq_acc_desc, [row, half * HALF_D], dq_stage, REDUCE_BY_PTX)

    # K's halves are read by both warpgroups' dQ products: meet once more (the next ds_full
    # barrier's phase) so that the other's last one has retired before K's buffer is staged
    # into or reloaded. (Found in review: without this the faster warpgroup overwrote K under
    # the other's last dQ product.) V's half is read by this warpgroup alone.
    if END_MEETING:
        partition_barrier()
        mbarrier.arrive(ds_full.index((meet + count) % 2), count=1)
        mbarrier.wait(ds_full.index((meet + count) % 2), ((meet + count) // 2) & 1)
    return dk, dv, count, key_first


@gluon.jit
def _fused_consumer(half: gl.constexpr, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage,
                    kv_ready, q_ready, do_ready, empty, ds_full, dk_desc, dv_desc, dq_acc_desc,
                    batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad,
                    qk_scale, softmax_scale, step_begin, n_steps, part_row, DkPart, DvPart,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                    CAUSAL: gl.constexpr, REDUCE_BY_PTX: gl.constexpr, Q_DESCENDING: gl.constexpr,
                    EXP_POLY: gl.constexpr, HOIST_STATS: gl.constexpr, DEFER_DK: gl.constexpr):
    """One warpgroup of a program's key tile: its steps (_key_tile_steps), then its dK, dV.
    A program with ``part_row`` >= 0 (the kernel's TAIL_SPLIT) runs a part of a key tile, and
    writes its dK·softmax_scale and dV in float32 to rows part_row.. of DkPart and DvPart
    ((parts · BLOCK_N, HEAD_DIM)) for _dkdv_parts_convert to sum."""
    dk, dv, _, key_first = _key_tile_steps(half, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem,
                                           dq_stage, kv_ready, q_ready, do_ready, empty, ds_full, dq_acc_desc, batch,
                                           head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size,
                                           heads_q, s_pad, qk_scale, step_begin, n_steps, 0, 0, 0, HEAD_DIM, BLOCK_M,
                                           HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX, Q_DESCENDING, EXP_POLY,
                                           HOIST_STATS, DEFER_DK)
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)
    # (part_row: a constexpr -1 without TAIL_SPLIT, so the branch goes at compile time)
    if part_row >= 0:  # a part of a split key tile: float32 partials, summed by _dkdv_parts_convert
        rows = part_row + half * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, kv_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
        offsets = rows.to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
        gl.store(DkPart + offsets, dk * softmax_scale)
        gl.store(DvPart + offsets, dv)
        # the last dQ reduction must have read dq_stage before the CTA ends (store_dkdv's
        # wait does it on the other path; found in review)
        tma.store_wait(0)
    else:
        store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, batch, head_kv, key_first, half, softmax_scale, HALF_N,
                   HEAD_DIM)


# A persistent program's key tile, as its loader hands it to the consumers: slots of tile_slots
# (written before the tile's K and V are armed on kv_ready, read once they have landed; N_START
# is -1 past the program's last tile).
BATCH, HEAD_KV, N_START, FIRST_TILE, N_Q_TILES = (gl.constexpr(i) for i in range(5))
TILE_SLOTS = gl.constexpr(5)


@gluon.jit
def _persistent_consumer(half: gl.constexpr, shared, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                         HALF_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                         REDUCE_BY_PTX: gl.constexpr, Q_DESCENDING: gl.constexpr, EXP_POLY: gl.constexpr,
                         HOIST_STATS: gl.constexpr, DEFER_DK: gl.constexpr, SKIP_END_MEETING: gl.constexpr):
    """One warpgroup of a persistent program: the key tiles its loader hands over in tile_slots,
    each as a program's (_key_tile_steps), the ring, the meetings and kv_ready's phase carried from
    one to the next (the coordinates come from the loader, so that this warpgroup keeps no grid
    arithmetic in registers beside its tiles'). Once both warpgroups have met after a tile's last
    dQ product its K and V are released (kv_empty) for the loader to copy the next tile's while
    this one's dK and dV are stored: where a warpgroup's two fit in its dQ staging box
    (STAGE_APART: d64, 2 × 8 KiB in 16 KiB) they are staged there, and the box's wait before the
    next tile's first dQ stage covers their stores; else (d128) they are staged in its K and V
    halves (store_dkdv), which are released once the stores have read them. ``shared``: what
    both consumer partitions take alike (the kernel's), as one tuple.

    SKIP_END_MEETING (where STAGE_APART): no meeting after a tile's last dQ product. It guards K
    against the other warpgroup's last dQ product, which here the loader's wait for both arrivals
    on kv_empty does (no consumer writes K), and the next tile's first dS store goes to the buffer
    of two steps before, which the meeting of the step between guards as within a tile. The
    meetings are then the ring's steps (meet = ring), one loop-carried count fewer: under Triton
    3.6 the d64 build's step loops keep 4 and 6 local loads where they kept 20 (and 13 stores)
    and 5."""
    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stages, kv_ready, kv_empty, q_ready, \
        do_ready, empty, ds_full, dk_desc, dv_desc, dq_acc_desc, tile_slots, heads_q, group_size, seqlen_q, seqlen_k, \
        s_pad, qk_scale, softmax_scale = shared
    dtype: gl.constexpr = k_smem.dtype
    dq_stage = dq_stages.index(half)
    STAGE_APART: gl.constexpr = 2 * HALF_N * HEAD_DIM * dtype.primitive_bitwidth <= BLOCK_M * HEAD_DIM // 2 * 32
    END_MEETING: gl.constexpr = not (SKIP_END_MEETING and STAGE_APART)
    ring = 0  # Q-side tiles sent round the ring before this key tile
    local = 0  # key tiles this program took before it (meetings: ring + local, or ring without END_MEETING)
    mbarrier.wait(kv_ready.index(0), 0)
    n_start = read_slot(tile_slots, N_START)
    while n_start >= 0:
        batch = read_slot(tile_slots, BATCH)
        head_kv = read_slot(tile_slots, HEAD_KV)
        dk, dv, count, _ = _key_tile_steps(half, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem,
                                           dq_stage, kv_ready, q_ready, do_ready, empty, ds_full, dq_acc_desc, batch,
                                           head_kv, n_start, seqlen_q, seqlen_k, read_slot(tile_slots, FIRST_TILE),
                                           read_slot(tile_slots, N_Q_TILES), group_size, heads_q, s_pad, qk_scale, 0,
                                           None, ring, ring + local if END_MEETING else ring, local & 1, HEAD_DIM,
                                           BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX, Q_DESCENDING, EXP_POLY,
                                           HOIST_STATS, DEFER_DK, END_MEETING)
        # The epilogue's coordinates read again (the slots hold them until both warpgroups release the
        # tile), rather than kept through the steps: d64's second consumer spilled in its steps otherwise.
        batch = read_slot(tile_slots, BATCH)
        head_kv = read_slot(tile_slots, HEAD_KV)
        key_first = read_slot(tile_slots, N_START) + half * HALF_N
        if STAGE_APART:
            # (the barriers written out, though Triton's own analysis places the same ones: every
            # thread's slot reads done before the one arrival lets the loader overwrite them; every
            # thread past the wait before any stores into the box; every store fenced before the
            # one thread issues the copies)
            partition_barrier()
            mbarrier.arrive(kv_empty, count=1)  # K and V are read by no product any more
            staging = reinterpret_shared(dq_stage, dtype, [2, 1, 1, HALF_N, HEAD_DIM], dk_desc.layout)
            tma.store_wait(0)  # the last dQ reduction has read the box
            partition_barrier()
            staging.index(0).reshape([HALF_N, HEAD_DIM]).store((dk * softmax_scale).to(dtype))
            staging.index(1).reshape([HALF_N, HEAD_DIM]).store(dv.to(dtype))
            fence_async_shared()
            partition_barrier()
            tma_store(dk_desc, [batch, head_kv, key_first, 0], staging.index(0))
            tma_store(dv_desc, [batch, head_kv, key_first, 0], staging.index(1))
        else:
            store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, batch, head_kv, key_first, half, softmax_scale,
                       HALF_N, HEAD_DIM)
            partition_barrier()  # every thread past the stores' wait before the one arrival
            mbarrier.arrive(kv_empty, count=1)
        ring += count
        local += 1
        mbarrier.wait(kv_ready.index(0), local & 1)
        n_start = read_slot(tile_slots, N_START)
    tma.store_wait(0)  # the last stores have read their staging before the CTA ends


@gluon.jit
def _load_key_tile(item, ring, local, q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem,
                   v_smem, lse_smem, delta_smem, kv_ready, kv_empty, q_ready, do_ready, empty, tile_slots, heads_q,
                   heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, num_items,
                   HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   Q_DESCENDING: gl.constexpr):
    """_persistent_loader's copies of key tile ``item`` of the grid, its program's ``local``-th,
    after the ``ring`` Q-side tiles its earlier ones sent round the ring: returns how many it sends."""
    # (the grid's key tiles, not the launch's programs, decide where a group of heads ends)
    batch, head_kv, n_start, first_tile, n_q_tiles, n_q_blocks = key_tile_of_program(
        item, num_n_blocks, heads_per_group, heads_kv, seqlen_q, seqlen_k, BLOCK_M, 2 * HALF_N, CAUSAL, num_items)
    count = group_size * n_q_tiles
    early = gl.minimum(count, NUM_STAGES)
    stream_q_tiles(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready,
                   do_ready, empty, batch, head_kv, heads_q, group_size, first_tile, n_q_tiles, n_q_blocks,
                   BLOCK_M, NUM_STAGES, Q_DESCENDING, 0, early, ring)
    mbarrier.wait(kv_empty, (local & 1) ^ 1)  # a fresh barrier passes at once
    # (the consumers read the slots once kv_ready completes, whose arrival releases these stores)
    write_slot(tile_slots, BATCH, batch)
    write_slot(tile_slots, HEAD_KV, head_kv)
    write_slot(tile_slots, N_START, n_start)
    write_slot(tile_slots, FIRST_TILE, first_tile)
    write_slot(tile_slots, N_Q_TILES, n_q_tiles)
    load_kv_halves(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, head_kv, n_start, HALF_N)
    stream_q_tiles(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready,
                   do_ready, empty, batch, head_kv, heads_q, group_size, first_tile, n_q_tiles, n_q_blocks,
                   BLOCK_M, NUM_STAGES, Q_DESCENDING, early, count - early, ring + early)
    return count


@gluon.jit
def _persistent_loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                       lse_smem, delta_smem, kv_ready, kv_empty, q_ready, do_ready, empty, tile_slots, heads_q,
                       heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, num_items,
                       TileCounter, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, Q_DESCENDING: gl.constexpr):
    """The loader warp of a persistent program (gluon_bwd._dkdv_loader's copies, key tile after
    key tile: pid, pid + programs, ... of the grid's order, key_tile_of_program; with TileCounter,
    each next one of a counter the grid shares, so that the tiles running at once stay consecutive
    in the grid's order, as with a program per key tile): each tile's first NUM_STAGES Q-side tiles
    go round the ring as the previous tile's last steps free its slots, before the wait for that
    tile's K and V to be released (kv_empty); then its coordinates into tile_slots, its K and V, and
    the rest of its Q-side tiles (_load_key_tile). After the last tile, N_START = -1 and kv_ready
    completed without a copy."""
    ring = 0
    local = 0
    # (relaxed: the counter only hands out numbers; nothing else is published through it)
    item = gl.program_id(0) if TileCounter is None else gl.atomic_add(TileCounter, 1, sem="relaxed")
    while item < num_items:
        ring += _load_key_tile(item, ring, local, q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem,
                               do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, kv_empty, q_ready, do_ready,
                               empty, tile_slots, heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks,
                               heads_per_group, num_items, HALF_N, BLOCK_M, NUM_STAGES, CAUSAL, Q_DESCENDING)
        local += 1
        if TileCounter is None:
            item += gl.num_programs(0)
        else:
            item = gl.atomic_add(TileCounter, 1, sem="relaxed")
    mbarrier.wait(kv_empty, (local & 1) ^ 1)
    write_slot(tile_slots, N_START, -1)
    mbarrier.arrive(kv_ready.index(0), count=1)


@gluon.jit
def _fused_shared(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_acc_desc, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """_dkdv_dq_kernel's shared memory, allocated, its barriers initialised (the caller fences):
    the Q-side ring and K, V halves (q_ring_buffers), two dSᵀ buffers (BLOCK_N keys × BLOCK_M
    queries), each consumer warpgroup's dQ staging box (BLOCK_M × HEAD_DIM/2 float32), kv_ready
    (a key half's K and V landed), the ring's barriers and ds_full (both warpgroups' dSᵀ stored)."""
    HALF_N: gl.constexpr = BLOCK_N // 2
    dtype: gl.constexpr = q_desc.dtype
    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem = q_ring_buffers(
        q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M, HALF_N, HEAD_DIM, NUM_STAGES, True)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    dq_stage = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], dq_acc_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready, do_ready, empty = q_ring_barriers(NUM_STAGES)
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(ds_full.index(i), count=2)  # one arrival per consumer warpgroup
    init_q_ring_barriers(q_ready, do_ready, empty, NUM_STAGES)
    return q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_ready, q_ready, do_ready, \
        empty, ds_full


@gluon.jit
def _persistent_programs(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc, dq_acc_desc,
                         heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, s_pad,
                         qk_scale, softmax_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr, REDUCE_BY_PTX: gl.constexpr, Q_DESCENDING: gl.constexpr,
                         EXP_POLY: gl.constexpr, HOIST_STATS: gl.constexpr, DEFER_DK: gl.constexpr,
                         SKIP_END_MEETING: gl.constexpr, TileCounter):
    """_dkdv_dq_kernel's PERSISTENT body: the same buffers and barriers as a program per key tile,
    and kv_empty (both consumer warpgroups arrive once a key tile's K and V are free)."""
    HALF_N: gl.constexpr = BLOCK_N // 2
    num_items = num_n_blocks * q_desc.shape[0] * heads_kv
    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_ready, q_ready, do_ready, empty, \
        ds_full = _fused_shared(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_acc_desc, HEAD_DIM, BLOCK_M,
                                BLOCK_N, NUM_STAGES)
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_empty, count=2)  # one arrival per consumer warpgroup
    tile_slots = gl.allocate_shared_memory(gl.int32, [TILE_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    fence_async_shared()
    # (what both consumers take alike, as one tuple; each warp_specialize entry must be written out
    # as a (function, arguments) pair: see gluon_fwd._fwd_pingpong_kernel)
    shared = (q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_ready, kv_empty, q_ready,
              do_ready, empty, ds_full, dk_desc, dv_desc, dq_acc_desc, tile_slots, heads_q, group_size, seqlen_q,
              seqlen_k, s_pad, qk_scale, softmax_scale)
    gl.warp_specialize([
        (_persistent_consumer, (0, shared, HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX, Q_DESCENDING,
                                EXP_POLY, HOIST_STATS, DEFER_DK, SKIP_END_MEETING)),
        (_persistent_consumer, (1, shared, HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX, Q_DESCENDING,
                                EXP_POLY, HOIST_STATS, DEFER_DK, SKIP_END_MEETING)),
        (_persistent_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                              lse_smem, delta_smem, kv_ready, kv_empty, q_ready, do_ready, empty, tile_slots,
                              heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group,
                              num_items, TileCounter, HALF_N, BLOCK_M, NUM_STAGES, CAUSAL, Q_DESCENDING)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def _entry_name(specialization) -> str:
    """_dkdv_dq_kernel's entry name: its own, or where its reduction is a TMA store for
    tma_reduce_ptx.py to rewrite, the name that rewrite looks for (and nothing else has)."""
    return tma_reduce_ptx.REWRITTEN if specialization.constants.get("REDUCE_BY_PTX") else "_dkdv_dq_kernel"


@gluon.jit(repr=_entry_name)
def _dkdv_dq_kernel(
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc, dq_acc_desc,
    heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, s_pad, qk_scale, softmax_scale,
    n_whole, splits, DkPart, DvPart, TileCounter,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
    REDUCE_BY_PTX: gl.constexpr = False, Q_DESCENDING: gl.constexpr = False, TAIL_SPLIT: gl.constexpr = False,
    EXP_POLY: gl.constexpr = 0, HOIST_STATS: gl.constexpr = False, DEFER_DK: gl.constexpr = False,
    PERSISTENT: gl.constexpr = False, SKIP_END_MEETING: gl.constexpr = False,
):
    """dK, dV (B, Hkv, Sk, D) of one BLOCK_N-key tile of one kv head, and its share of dQ added
    into the float32 sum behind ``dq_acc_desc`` ((B·Hq·S_pad, HEAD_DIM), zeroed, boxes of
    (BLOCK_M, HEAD_DIM / 2)). Grid and the other descriptors as gluon_bwd._dkdv_kernel's.
    ``REDUCE_BY_PTX``: the reduction issued as a TMA store for tma_reduce_ptx.py to rewrite
    (a Triton whose Gluon lacks it; gluon_common.tma_reduce_add). ``Q_DESCENDING``: each
    program visits its Q tiles last first (gluon_common.q_tile_start). ``EXP_POLY``: 0, 1 or 2 of
    every 4 of Pᵀ's exponentials by a polynomial on the FMA units (exp2_split.py). ``HOIST_STATS``:
    each step's lse2 row loaded while its Sᵀ product runs (gluon_bwd._dkdv_tile). ``DEFER_DK``: each
    step's dK product left in flight through the two warpgroups' meeting and the dQ product, and
    waited for with dQ's (hopper.FUSED_DEFER_DK).

    ``TAIL_SPLIT`` (hopper.tail_split): programs from ``n_whole`` on each run one of ``splits``
    parts of a key tile's (query head, Q tile) steps, ``splits`` programs a tile, so that the
    grid's last wave is not left part empty; their dK, dV go to float32 partials (DkPart, DvPart:
    (split tiles · splits · BLOCK_N, HEAD_DIM)), which _dkdv_parts_convert sums. Key tile of
    program n_whole + r: n_whole + r // splits, in the plain order (heads_per_group = 1). Without
    it the launch passes 0, 1, None, None for those four (positional, so that fast_launch keys
    the partials by dtype and alignment, not by the tensors).

    ``PERSISTENT`` (hopper.fused_persistent; not with TAIL_SPLIT): a grid of fewer programs (one a
    SM), each taking the key tiles pid, pid + programs, ... of the order above: the CTA's start is
    paid once per program, and the next tile's K, V and first Q-side tiles load while this one's
    last steps and epilogue run (_persistent_loader, _persistent_consumer; SKIP_END_MEETING: see
    _persistent_consumer). ``TileCounter`` (persistent programs; else None): an int32 zeroed for
    the launch, from which the loaders take their key tiles in the grid's order (a dynamic
    scheduler, FlashAttention-3's) instead of in fixed turns."""
    gl.static_assert(num_warps == 4)
    gl.static_assert(not (PERSISTENT and TAIL_SPLIT))
    gl.static_assert(PERSISTENT or not SKIP_END_MEETING)
    gl.static_assert(PERSISTENT or TileCounter is None)
    HALF_N: gl.constexpr = BLOCK_N // 2
    if PERSISTENT:
        _persistent_programs(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc, dq_acc_desc,
                             heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, s_pad,
                             qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, LOADER_REGS,
                             CONSUMER_REGS, REDUCE_BY_PTX, Q_DESCENDING, EXP_POLY, HOIST_STATS, DEFER_DK,
                             SKIP_END_MEETING, TileCounter)
        return
    if TAIL_SPLIT:
        r = gl.program_id(0) - n_whole  # >= 0: a part, the r-th of the split parts
        tile = gl.minimum(gl.program_id(0), n_whole) + gl.maximum(r, 0) // splits
    else:
        tile = gl.program_id(0)
    batch, head_kv, n_start, first_tile, n_q_tiles, n_q_blocks = key_tile_of_program(
        tile, num_n_blocks, heads_per_group, heads_kv, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)
    if TAIL_SPLIT:
        total = group_size * n_q_tiles
        part = gl.maximum(r, 0) % splits
        parts = 1 + (r >= 0).to(gl.int32) * (splits - 1)
        step_begin = part * total // parts
        n_steps = (part + 1) * total // parts - step_begin
        part_row = r * BLOCK_N  # its rows in DkPart and DvPart (negative: a whole tile)
    else:
        step_begin = 0
        n_steps: gl.constexpr = None
        part_row: gl.constexpr = -1

    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage, kv_ready, q_ready, do_ready, empty, \
        ds_full = _fused_shared(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, dq_acc_desc, HEAD_DIM, BLOCK_M,
                                BLOCK_N, NUM_STAGES)
    fence_async_shared()

    gl.warp_specialize([
        (_fused_consumer, (0, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage.index(0),
                           kv_ready, q_ready, do_ready, empty, ds_full, dk_desc, dv_desc, dq_acc_desc, batch, head_kv,
                           n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad, qk_scale,
                           softmax_scale, step_begin, n_steps, part_row, DkPart, DvPart,
                           HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX,
                           Q_DESCENDING, EXP_POLY, HOIST_STATS, DEFER_DK)),
        (_fused_consumer, (1, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, dq_stage.index(1),
                           kv_ready, q_ready, do_ready, empty, ds_full, dk_desc, dv_desc, dq_acc_desc, batch, head_kv,
                           n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, group_size, heads_q, s_pad, qk_scale,
                           softmax_scale, step_begin, n_steps, part_row, DkPart, DvPart,
                           HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX,
                           Q_DESCENDING, EXP_POLY, HOIST_STATS, DEFER_DK)),
        (_dkdv_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                        lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty, batch, head_kv, n_start, heads_q,
                        group_size, first_tile, n_q_tiles, n_q_blocks, HALF_N, BLOCK_M, NUM_STAGES, Q_DESCENDING,
                        step_begin, n_steps)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


@triton.jit
def _dq_convert(dq_acc, DQ, stride_qb, stride_qh, stride_qm, heads_q, seqlen_q, head_dim, s_pad, softmax_scale,
                HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """dq (B, Hq, Sq, head_dim) view = softmax_scale · the sum's rows (B·Hq·S_pad, HEAD_DIM), in
    dq's dtype; HEAD_DIM ≥ head_dim is the kernel's width (its extra columns are not written).
    Grid (B·Hq, cdiv(Sq, BLOCK)): batch × heads on the first axis, which has no 65535 limit."""
    bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    inside = (rows < seqlen_q)[:, None] & (cols < head_dim)[None, :]
    acc = tl.load(dq_acc + (bh.to(tl.int64) * s_pad + rows)[:, None] * HEAD_DIM + cols[None, :], mask=inside)
    batch = bh // heads_q
    head = bh % heads_q
    out = DQ + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + rows[:, None].to(tl.int64) * stride_qm
    tl.store(out + cols[None, :], (acc * softmax_scale).to(DQ.dtype.element_ty), mask=inside)


@triton.jit
def _dkdv_parts_convert(DkPart, DvPart, DK, DV, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                        n_whole, splits, num_n_blocks, heads_kv, seqlen_k, head_dim,
                        BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """dk, dv (B, Hkv, Sk, head_dim) views of the key tiles _dkdv_dq_kernel split (TAIL_SPLIT):
    the sum of each tile's ``splits`` float32 partials (rows (t · splits + part) · BLOCK_N.. of
    DkPart, DvPart, (·, HEAD_DIM)), in dk's and dv's dtype, rows past the keys not written.
    Grid (split tiles, BLOCK_N / ROWS); split tile t is the kernel's key tile n_whole + t, whose
    (batch · Hkv + head, tile) the plain order gives: divmod by num_n_blocks."""
    t = tl.program_id(0)
    tile = n_whole + t
    bh = tile // num_n_blocks
    batch = bh // heads_kv
    head = bh % heads_kv
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, HEAD_DIM)
    dk = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    dv = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for part in range(splits):  # a fixed order: these sums give the same bits every call
        offsets = ((t * splits + part) * BLOCK_N + rows).to(tl.int64)[:, None] * HEAD_DIM + cols[None, :]
        dk += tl.load(DkPart + offsets)
        dv += tl.load(DvPart + offsets)
    keys = (tile % num_n_blocks) * BLOCK_N + rows
    inside = (keys < seqlen_k)[:, None] & (cols < head_dim)[None, :]
    keys = keys.to(tl.int64)[:, None]
    tl.store(DK + batch.to(tl.int64) * stride_kb + head.to(tl.int64) * stride_kh + keys * stride_kn + cols[None, :],
             dk.to(DK.dtype.element_ty), mask=inside)
    tl.store(DV + batch.to(tl.int64) * stride_vb + head.to(tl.int64) * stride_vh + keys * stride_vn + cols[None, :],
             dv.to(DV.dtype.element_ty), mask=inside)
