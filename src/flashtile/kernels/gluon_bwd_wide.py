"""Hopper (sm_90) dK/dV kernel in Gluon for wide heads (head dim 256): one warpgroup per gradient.

gluon_bwd.py's dK/dV kernel gives each consumer warpgroup 64 keys and both of their gradients.
At d256 that is two 64 × 256 float32 accumulators, 256 registers per thread, past the 240 a
consumer warpgroup gets. Here the CTA's 64 keys are shared by both warpgroups, and the work
is split by gradient instead, each warpgroup holding one accumulator (128 registers):

- the **dV warpgroup** (default partition) computes Sᵀ = K Qᵀ and Pᵀ = exp2(Sᵀ·qk_scale − lse2)
  (the causal mask on tiles that cross the diagonal), hands Pᵀ in float32 to the other
  warpgroup through shared memory, and accumulates dV += Pᵀ dO;
- the **dK warpgroup** computes dPᵀ = V dOᵀ, takes Pᵀ, forms dSᵀ = Pᵀ ∘ (dPᵀ − Delta) and
  accumulates dK += dSᵀ Q;
- a **loader** warp loads K and V once and streams (Q, lse2) and (dO, Delta) tiles of BLOCK_M
  query rows through a NUM_STAGES ring (gluon_common.stream_q_tiles), over every query head
  of the GQA group.

Each warpgroup runs two of the four products per tile, of equal size, so the tensor cores see
a balanced load, and issues its next tile's first product (Sᵀ or dPᵀ) right behind the
current tile's second before waiting for it. Pᵀ passes one way, through P_BUFFERS slots each
with a "full" and an "empty" mbarrier, so the dV warpgroup can run up to that many tiles ahead
(the ring's NUM_STAGES bounds it too: a slot is refilled only once both warpgroups are done with
it). dK (times softmax_scale) is staged in K's buffer once the dV warpgroup's last K·Qᵀ product
has retired (the "k_free" barrier), dV in V's once the dK warpgroup's last V·dOᵀ has (the
"v_free" barrier), and both are TMA-stored. Conventions (views, lse2 and Delta buffers, bottom-right
causal, padding rows) are gluon_bwd.py's; dQ comes from its dQ kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from .gluon_bwd import transposed_probabilities
from .gluon_common import (accumulator_layout, init_q_ring_barriers, key_tile_of_program, partition_barrier,
                           q_ring_barriers, q_ring_buffers, stream_q_tiles, tma_load, tma_store)


@gluon.jit
def _loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, lse_smem,
            delta_smem, kv_ready, q_ready, do_ready, empty, batch, head_kv, n_start, heads_q, group_size, first_tile,
            n_q_tiles, n_q_blocks, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    """One warp: the CTA's K and V tiles once, then the Q-side tiles."""
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [batch, head_kv, n_start, 0], kv_ready, k_smem)
    tma_load(v_desc, [batch, head_kv, n_start, 0], kv_ready, v_smem)
    stream_q_tiles(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                   empty, batch, head_kv, heads_q, group_size, first_tile, n_q_tiles, n_q_blocks, BLOCK_M, NUM_STAGES)


@gluon.jit
def _dv_consumer(q_smem, do_smem, k_smem, v_smem, lse_smem, p_smem, kv_ready, q_ready, do_ready, empty, p_full,
                 p_empty, v_free, k_free, dv_desc, batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles,
                 group_size, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 NUM_STAGES: gl.constexpr, P_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr):
    """Sᵀ, Pᵀ (handed over) and dV += Pᵀ dO for the CTA's BLOCK_N keys, every streamed Q tile."""
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_M)  # Sᵀ: BLOCK_N keys x BLOCK_M queries
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)  # dV: BLOCK_N x HEAD_DIM
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query
    dtype: gl.constexpr = k_smem.dtype

    keys = n_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    shift = seqlen_k - seqlen_q
    k_tile = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_tile = v_smem.reshape([BLOCK_N, HEAD_DIM])
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)

    total = group_size * n_q_tiles  # >= 1: every key is seen by some query
    mbarrier.wait(kv_ready, 0)
    # Sᵀ of tile 0 before the loop; each step then issues the next tile's Sᵀ right behind its
    # own dV product, so the tensor cores get the two back to back (the last step recomputes
    # its own tile's Sᵀ and drops it: no branch around an asynchronous product).
    mbarrier.wait(q_ready.index(0), 0)
    s = warpgroup_mma(k_tile, q_smem.index(0).reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    for it in range(total):
        g = it // n_q_tiles
        m_start = (first_tile + it - g * n_q_tiles) * BLOCK_M
        slot = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        buffer = it % P_BUFFERS
        do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        s = warpgroup_mma_wait(0, deps=(s, ))
        p = transposed_probabilities(s, lse_smem, slot, keys, n_start, m_start, shift, qk_scale, BLOCK_N, BLOCK_M,
                                     col_layout, CAUSAL)
        # Pᵀ to the dK warpgroup: the slot free (a fresh barrier passes the first lap), every
        # thread's store done, then one arrival.
        mbarrier.wait(p_empty.index(buffer), ((it // P_BUFFERS) & 1) ^ 1)
        p_smem.index(buffer).store(p)
        partition_barrier()
        mbarrier.arrive(p_full.index(buffer), count=1)
        p16 = gl.convert_layout(p.to(dtype), a_layout, assert_trivial=True)
        mbarrier.wait(do_ready.index(slot), phase)
        dv = warpgroup_mma(p16, do_tile, dv, is_async=True)
        following = gl.minimum(it + 1, total - 1)
        next_slot = following % NUM_STAGES
        mbarrier.wait(q_ready.index(next_slot), (following // NUM_STAGES) & 1)
        s = warpgroup_mma(k_tile, q_smem.index(next_slot).reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)), s_zero,
                          use_acc=False, is_async=True)
        dv, p16 = warpgroup_mma_wait(1, deps=(dv, p16))  # dV done; the next Sᵀ may still run
        mbarrier.arrive(empty.index(slot), count=1)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_free, count=1)  # every K·Qᵀ product retired: K's buffer may take dK

    # V is read by the dK warpgroup's products until its loop ends.
    mbarrier.wait(v_free, 0)
    v_tile.store(dv.to(dtype))
    fence_async_shared()
    tma_store(dv_desc, [batch, head_kv, n_start, 0], v_smem)
    tma.store_wait(0)


@gluon.jit
def _dk_consumer(q_smem, do_smem, k_smem, v_smem, delta_smem, p_smem, kv_ready, q_ready, do_ready, empty, p_full,
                 p_empty, v_free, k_free, dk_desc, batch, head_kv, n_start, n_q_tiles, group_size, softmax_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                 P_BUFFERS: gl.constexpr):
    """dPᵀ, dSᵀ and dK += dSᵀ Q for the CTA's BLOCK_N keys, every streamed Q tile."""
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_M)
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = k_smem.dtype

    k_tile = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_tile = v_smem.reshape([BLOCK_N, HEAD_DIM])
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)

    total = group_size * n_q_tiles
    mbarrier.wait(kv_ready, 0)
    # As the dV warpgroup: dPᵀ of tile 0 first, then each step's next dPᵀ right behind its dK.
    mbarrier.wait(do_ready.index(0), 0)
    dp = warpgroup_mma(v_tile, do_smem.index(0).reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)), s_zero, use_acc=False,
                       is_async=True)
    for it in range(total):
        slot = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        buffer = it % P_BUFFERS
        q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        dp = warpgroup_mma_wait(0, deps=(dp, ))
        delta = delta_smem.index(slot).reshape([BLOCK_M]).load(col_layout)
        mbarrier.wait(p_full.index(buffer), (it // P_BUFFERS) & 1)
        p = p_smem.index(buffer).load(s_layout)
        partition_barrier()  # every thread's load done before the slot is handed back
        mbarrier.arrive(p_empty.index(buffer), count=1)
        ds = p * (dp - delta[None, :])
        ds16 = gl.convert_layout(ds.to(dtype), a_layout, assert_trivial=True)
        mbarrier.wait(q_ready.index(slot), phase)
        dk = warpgroup_mma(ds16, q_tile, dk, is_async=True)
        following = gl.minimum(it + 1, total - 1)
        next_slot = following % NUM_STAGES
        mbarrier.wait(do_ready.index(next_slot), (following // NUM_STAGES) & 1)
        dp = warpgroup_mma(v_tile, do_smem.index(next_slot).reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)), s_zero,
                           use_acc=False, is_async=True)
        dk, ds16 = warpgroup_mma_wait(1, deps=(dk, ds16))  # dK done; the next dPᵀ may still run
        mbarrier.arrive(empty.index(slot), count=1)
    dp = warpgroup_mma_wait(0, deps=(dp, ))
    mbarrier.arrive(v_free, count=1)  # every V·dOᵀ has retired: V's buffer may take dV

    # K's buffer takes dK once the dV warpgroup's last K·Qᵀ product has retired.
    mbarrier.wait(k_free, 0)
    k_tile.store((dk * softmax_scale).to(dtype))
    fence_async_shared()
    tma_store(dk_desc, [batch, head_kv, n_start, 0], k_smem)
    tma.store_wait(0)


@gluon.jit
def _dkdv_wide_kernel(
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc,
    heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    P_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """dK, dV (B, Hkv, Sk, D) of one BLOCK_N-key tile (BLOCK_N = 64: one warpgroup's rows) of
    one kv head.

    Grid: num_n_blocks * B * Hkv programs, key tiles fastest (under CAUSAL in groups of heads_per_group
    kv heads, heads fastest within a group: key_tile_of_program); num_warps=4. Descriptors:
    q/do over (B, Hq, Sq, D) with (1, 1, BLOCK_M, D) blocks; k/v/dk/dv over (B, Hkv, Sk, D)
    with (1, 1, BLOCK_N, D); lse/delta over the (B*Hq, S_pad) float32 buffers with (1, BLOCK_M).
    """
    gl.static_assert(num_warps == 4)
    gl.static_assert(BLOCK_N == 64)
    batch, head_kv, n_start, first_tile, n_q_tiles, n_q_blocks = key_tile_of_program(
        gl.program_id(0), num_n_blocks, heads_per_group, heads_kv, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)

    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem = q_ring_buffers(
        q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, False)
    # Pᵀ in float32, as the accumulator holds it: both warpgroups share the accumulator
    # layout, so each thread reads back what its twin wrote. A warp's store covers 8 rows of
    # 8 columns (4 threads a row); unswizzled, rows 256 bytes apart fall on the same 8 banks.
    # Swizzling 8-column groups by row puts the 8 rows on 8 different 32-byte groups: all 32
    # banks, two wavefronts per store instead of eight.
    p_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    p_smem = gl.allocate_shared_memory(gl.float32, [P_BUFFERS, BLOCK_N, BLOCK_M], p_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready, do_ready, empty = q_ring_barriers(NUM_STAGES)
    p_full = gl.allocate_shared_memory(gl.int64, [P_BUFFERS, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [P_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(v_free, count=1)
    mbarrier.init(k_free, count=1)
    init_q_ring_barriers(q_ready, do_ready, empty, NUM_STAGES)
    for i in gl.static_range(P_BUFFERS):
        mbarrier.init(p_full.index(i), count=1)
        mbarrier.init(p_empty.index(i), count=1)
    fence_async_shared()

    gl.warp_specialize([
        (_dv_consumer, (q_smem, do_smem, k_smem, v_smem, lse_smem, p_smem, kv_ready, q_ready, do_ready, empty, p_full,
                        p_empty, v_free, k_free, dv_desc, batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile,
                        n_q_tiles, group_size, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, P_BUFFERS, CAUSAL)),
        (_dk_consumer, (q_smem, do_smem, k_smem, v_smem, delta_smem, p_smem, kv_ready, q_ready, do_ready, empty,
                        p_full, p_empty, v_free, k_free, dk_desc, batch, head_kv, n_start, n_q_tiles, group_size,
                        softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, P_BUFFERS)),
        (_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, lse_smem,
                   delta_smem, kv_ready, q_ready, do_ready, empty, batch, head_kv, n_start, heads_q, group_size,
                   first_tile, n_q_tiles, n_q_blocks, BLOCK_M, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
