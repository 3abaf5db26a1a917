"""Hopper (sm_90) FlashAttention backward in Triton's Gluon dialect: dK/dV and dQ kernels.

Taken by default on sm_90 at head dims 64 and 128, where it beats the Triton backward
(kernels/hopper.py decides; at d256 the dK/dV kernel is gluon_bwd_wide.py's, dQ this one's);
compiled for sm_90 on the CPU by tools/compile_check.py.

Conventions (as flashtile/kernels/bwd.py): q, dO, dq are (B, Hq, Sq, D) views, k, v, dk, dv
(B, Hkv, Sk, D); LSE natural log; Delta = rowsum(dO * O); P = exp2(S * qk_scale - lse2) with
qk_scale = softmax_scale * log2(e) and lse2 = LSE * log2(e) (+inf for rows that saw no key and
for padding rows, so their P is exactly 0); causal is bottom-right aligned (query i sees key j
iff j <= i + Sk - Sq); GQA: query head h reads kv head h // (Hq / Hkv).

lse2 and Delta live in (B*Hq, S_pad) float32 buffers, S_pad a multiple of 128, padding rows
lse2 = +inf, Delta = 0. The dQ kernels run first; with ROW_STATS they write them (`row_stats`:
each program's own 128 rows, from O, dO and the forward's LSE: the preprocess folded in, one
launch fewer), without it they read what the preprocess (bwd.py) wrote. The dK/dV kernels,
launched after, read them. Rows past a sequence's end then need no mask anywhere: TMA
zero-fills Q/dO/K/V rows outside the (B, H, S, D) view, P there is exp2(-inf) = 0, and the TMA
stores clip at the tensor's edge.

dK/dV kernel (`_dkdv_kernel`), one CTA per (128-key tile, batch, kv head), num_warps=4 plus
workers: partitions = consumer warpgroup 0 (default, keys [n0, n0+64)), consumer warpgroup 1
(worker, keys [n0+64, n0+128)), loader (1 warp). The loader TMA-loads the two K and V halves
once, then streams (Q, lse2) and (dO, Delta) tiles of BLOCK_M query rows through a NUM_STAGES ring
(ready barriers count 1 + tx bytes, one "empty" barrier per slot with count 2), over every
query head of the GQA group. Per tile each consumer warpgroup computes, in the transposed
orientation (keys as rows):
    S^T  = K Q^T            wgmma, A = K (smem), B = Q^T (permuted smem view)   64 x 64
    dP^T = V dO^T           wgmma, A = V (smem), B = dO^T                        64 x 64
    P^T  = exp2(S^T * qk_scale - lse2[None, :])   (causal mask on diagonal tiles only)
    dV  += P^T dO           wgmma, A = P^T from registers (DotOperandLayout), B = dO (smem)
    dS^T = P^T * (dP^T - Delta[None, :])
    dK  += dS^T Q           wgmma, A = dS^T from registers, B = Q (smem)
dK (times softmax_scale) and dV are staged in the dead K/V smem halves and TMA-stored.

dQ kernel (`_dq_kernel`), one CTA per (128-row Q tile, batch, q head), same partitions: each
consumer owns 64 query rows, whose lse2 and Delta it first works out and stores (ROW_STATS) or
loads; the loader loads Q, dO halves once and streams K, V tiles of
BLOCK_N keys through a ring with separate K/V ready and empty barriers (as the forward):
    S = Q K^T, dP = dO V^T, P = exp2(S * qk_scale - lse2[:, None]), dS = P * (dP - Delta),
    dQ += dS K  (dS from registers, K from smem); dQ * softmax_scale staged in Q's smem.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from .common import LOG2E
from .exp2_split import exp2_split
from .gluon_common import (accumulator_layout, hide_scores, init_q_ring_barriers, key_tile_of_program,
                           kv_ring_barriers, kv_ring_buffers, listed_q_tile_of_program, load_q_side_tile,
                           q_ring_barriers, q_ring_buffers, q_tile_of_program, stream_kv_tiles, stream_q_tiles,
                           tma_load, tma_store)


# ----------------------------------------------------------------------------------------------
# dK / dV
# ----------------------------------------------------------------------------------------------


@gluon.jit
def load_kv_halves(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, head_kv, n_start, HALF_N: gl.constexpr):
    """A dK/dV CTA's keys n_start.. as two halves of HALF_N rows of K and V, half h on kv_ready[h]."""
    for h in gl.static_range(2):
        mbarrier.expect(kv_ready.index(h), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma_load(k_desc, [batch, head_kv, n_start + h * HALF_N, 0], kv_ready.index(h), k_smem.index(h))
        tma_load(v_desc, [batch, head_kv, n_start + h * HALF_N, 0], kv_ready.index(h), v_smem.index(h))


@gluon.jit
def store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, batch, head_kv, key_first, half: gl.constexpr,
               softmax_scale, HALF_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A dK/dV warpgroup's epilogue: dK·softmax_scale and dV of its keys key_first.. staged in its
    K and V halves (dead: every product that read them retired) and TMA-stored, clipped at the
    keys' end."""
    dtype: gl.constexpr = k_smem.dtype
    k_smem.index(half).reshape([HALF_N, HEAD_DIM]).store((dk * softmax_scale).to(dtype))
    v_smem.index(half).reshape([HALF_N, HEAD_DIM]).store(dv.to(dtype))
    fence_async_shared()
    tma_store(dk_desc, [batch, head_kv, key_first, 0], k_smem.index(half))
    tma_store(dv_desc, [batch, head_kv, key_first, 0], v_smem.index(half))
    tma.store_wait(0)


@gluon.jit
def _dkdv_loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc,
                 q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                 kv_ready, q_ready, do_ready, empty,
                 batch, head_kv, n_start, heads_q, group_size, first_tile, n_q_tiles, n_q_blocks,
                 HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                 DESCENDING: gl.constexpr = False, step_begin=0, n_steps=None):
    """One warp: K, V halves once; then (Q, lse2) and (dO, Delta) of every visited Q tile of
    every query head of the group (DESCENDING, step_begin, n_steps: stream_q_tiles), tile `it`
    into slot it % NUM_STAGES."""
    load_kv_halves(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, head_kv, n_start, HALF_N)
    stream_q_tiles(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                   empty, batch, head_kv, heads_q, group_size, first_tile, n_q_tiles, n_q_blocks, BLOCK_M, NUM_STAGES,
                   DESCENDING, step_begin, n_steps)


@gluon.jit
def transposed_probabilities(s, lse_smem, slot, keys, key_first, m_start, shift, qk_scale, KEY_ROWS: gl.constexpr,
                             BLOCK_M: gl.constexpr, col_layout: gl.constexpr, CAUSAL: gl.constexpr, masked=False,
                             batch=0, head=0, seqlen_q=0, seqlen_k=0, mask_buffer=None, MASK_MOD: gl.constexpr = None,
                             EXP_POLY: gl.constexpr = 0, lse2=None):
    """Pᵀ = exp2(Sᵀ·qk_scale − lse2) of a dK/dV step: ``s`` its KEY_ROWS keys (from ``key_first``;
    ``keys`` their indices) × BLOCK_M queries (from ``m_start``), lse2 the ring's row in ``slot``;
    under CAUSAL (bottom-right, ``shift`` = Sk − Sq) masked only where the tile crosses the diagonal.
    With MASK_MOD (a block mask's list), a ``masked`` (partial) tile hides what
    MASK_MOD(batch, head, q_idx, kv_idx, mask_buffer) does not see; keys past the end need no
    mask (their dK, dV rows are never stored), queries past it have lse2 = +inf. EXP_POLY of every
    4 exponentials by a polynomial on the FMA units, the rest on the SFU (exp2_split.py). ``lse2``:
    the row already loaded (_dkdv_tile's HOIST_STATS), else loaded here."""
    if lse2 is None:
        lse2 = lse_smem.index(slot).reshape([BLOCK_M]).load(col_layout)
    s = s * qk_scale - lse2[None, :]
    if CAUSAL:  # mask only tiles that cross the diagonal: some key > some query + shift
        if key_first + KEY_ROWS - 1 > m_start + shift:
            queries = m_start + gl.arange(0, BLOCK_M, layout=col_layout)
            s = gl.where(keys[:, None] <= (queries + shift)[None, :], s, -float("inf"))
    if MASK_MOD is not None:
        if masked:
            # indices clamped into range (a mask may index a tensor with them), as fwd.py does
            queries = gl.minimum(m_start + gl.arange(0, BLOCK_M, layout=col_layout), seqlen_q - 1)
            visible = MASK_MOD(batch, head, queries[None, :], gl.minimum(keys, seqlen_k - 1)[:, None], mask_buffer)
            s = gl.where(visible, s, -float("inf"))
    return exp2_split(s, EXP_POLY)


@gluon.jit
def _dkdv_tile(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv, s_zero, keys, key_first, m_start,
               shift, qk_scale, ds_out, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
               CAUSAL: gl.constexpr, STORE_DS: gl.constexpr, masked=False, batch=0, head=0, seqlen_q=0, seqlen_k=0,
               mask_buffer=None, MASK_MOD: gl.constexpr = None, EXP_POLY: gl.constexpr = 0,
               HOIST_STATS: gl.constexpr = False):
    """_dkdv_tile_issued's step with every product retired: returns (dk, dv)."""
    dk, dv, p16, ds16 = _dkdv_tile_issued(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv, s_zero,
                                          keys, key_first, m_start, shift, qk_scale, ds_out, HALF_N, BLOCK_M,
                                          HEAD_DIM, CAUSAL, STORE_DS, masked, batch, head, seqlen_q, seqlen_k,
                                          mask_buffer, MASK_MOD, EXP_POLY, HOIST_STATS)
    dv, dk, p16, ds16 = warpgroup_mma_wait(0, deps=(dv, dk, p16, ds16))
    return dk, dv


@gluon.jit
def _dkdv_tile_issued(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv, s_zero, keys, key_first,
                      m_start, shift, qk_scale, ds_out, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr,
                      HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, STORE_DS: gl.constexpr, masked=False, batch=0,
                      head=0, seqlen_q=0, seqlen_k=0, mask_buffer=None, MASK_MOD: gl.constexpr = None,
                      EXP_POLY: gl.constexpr = 0, HOIST_STATS: gl.constexpr = False):
    """One step of a dK/dV consumer warpgroup, its HALF_N keys against one BLOCK_M-row Q tile:
    Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp2(Sᵀ·qk_scale − lse2) (the causal mask on tiles that cross
    the diagonal), dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − Delta), dK += dSᵀ Q; with STORE_DS, dSᵀ (in the
    inputs' dtype) is also stored into ``ds_out`` (gluon_bwd_fused.py's dQ reads it). Returns
    (dk, dv, p16, ds16) with dV's and dK's products still in flight: the caller waits for them
    (warpgroup_mma_wait with those four as deps) before it reads dk or dv or releases the Q tile.
    lse_smem, delta_smem: the ring of (1, BLOCK_M) rows; ``slot`` the step's. ``masked`` ...
    MASK_MOD: a block mask's partial tile, EXP_POLY: the exponentials' split
    (transposed_probabilities). HOIST_STATS: lse2's row loaded while the Sᵀ product runs, so
    that its shared-memory latency is not on the path from Sᵀ to Pᵀ (Delta's too spilled: 56 bytes
    of stack at d128 against 16, 312 at d64, Triton 3.6)."""
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_M)  # S^T, dP^T: HALF_N keys x BLOCK_M queries
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)  # dK, dV: HALF_N x HEAD_DIM
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query (column of S^T)
    dtype: gl.constexpr = k_tile.dtype
    s = warpgroup_mma(k_tile, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(v_tile, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    lse2 = None
    if HOIST_STATS:
        lse2 = lse_smem.index(slot).reshape([BLOCK_M]).load(col_layout)
    s = warpgroup_mma_wait(1, deps=(s, ))
    p = transposed_probabilities(s, lse_smem, slot, keys, key_first, m_start, shift, qk_scale, HALF_N, BLOCK_M,
                                 col_layout, CAUSAL, masked, batch, head, seqlen_q, seqlen_k, mask_buffer, MASK_MOD,
                                 EXP_POLY, lse2)
    p16 = gl.convert_layout(p.to(dtype), a_layout, assert_trivial=True)
    dv = warpgroup_mma(p16, do_tile, dv, is_async=True)
    dp = warpgroup_mma_wait(1, deps=(dp, ))  # S^T, dP^T done; dV may still run
    delta = delta_smem.index(slot).reshape([BLOCK_M]).load(col_layout)
    ds = (p * (dp - delta[None, :])).to(dtype)
    if STORE_DS:
        ds_out.store(ds)
    ds16 = gl.convert_layout(ds, a_layout, assert_trivial=True)
    dk = warpgroup_mma(ds16, q_tile, dk, is_async=True)
    return dk, dv, p16, ds16


@gluon.jit
def _dkdv_consumer_start(half: gl.constexpr, k_smem, v_smem, kv_ready, n_start, HEAD_DIM: gl.constexpr,
                         BLOCK_M: gl.constexpr, HALF_N: gl.constexpr):
    """A dK/dV consumer warpgroup's start, the dense and the block-sparse one's: its first key,
    its keys' indices (rows of S^T), its K and V halves once loaded, and zeroed dK, dV (HALF_N x
    HEAD_DIM) and S^T accumulator (HALF_N keys x BLOCK_M queries, dP^T's layout too)."""
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_M)
    kv_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)
    key_first = n_start + half * HALF_N
    keys = key_first + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
    k_tile = k_smem.index(half).reshape([HALF_N, HEAD_DIM])
    v_tile = v_smem.index(half).reshape([HALF_N, HEAD_DIM])
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, layout=kv_layout)
    s_zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, layout=s_layout)
    mbarrier.wait(kv_ready.index(half), 0)
    return key_first, keys, k_tile, v_tile, dk, dv, s_zero


@gluon.jit
def _dkdv_consumer(half: gl.constexpr, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                   kv_ready, q_ready, do_ready, empty, dk_desc, dv_desc,
                   batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles, n_q_blocks, group_size,
                   qk_scale, softmax_scale,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                   CAUSAL: gl.constexpr):
    """One warpgroup: keys [n_start + half*HALF_N, +HALF_N), every streamed Q tile."""
    key_first, keys, k_tile, v_tile, dk, dv, s_zero = _dkdv_consumer_start(half, k_smem, v_smem, kv_ready, n_start,
                                                                           HEAD_DIM, BLOCK_M, HALF_N)
    shift = seqlen_k - seqlen_q
    total = group_size * n_q_tiles
    for it in range(total):
        # (divisions rather than carried counters: three more live registers made ptxas 12.8
        # spill 44 B in the causal d128 variant)
        g = it // n_q_tiles
        m_start = (first_tile + it - g * n_q_tiles) * BLOCK_M
        slot = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        mbarrier.wait(q_ready.index(slot), phase)
        mbarrier.wait(do_ready.index(slot), phase)
        # Causal: this warpgroup's first key is seen from query key_first - shift on; the
        # CTA's first Q tile is chosen for warpgroup 0, warpgroup 1 may skip it (but still
        # waits for the copies and releases the slot).
        run = True
        if CAUSAL:
            run = key_first <= m_start + BLOCK_M - 1 + shift
        if run:
            dk, dv = _dkdv_tile(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv, s_zero, keys,
                                key_first, m_start, shift, qk_scale, None, HALF_N, BLOCK_M, HEAD_DIM, CAUSAL, False)
        mbarrier.arrive(empty.index(slot), count=1)

    # Epilogue: K and V halves are dead (every wgmma reading them retired): stage dK, dV there.
    store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, batch, head_kv, key_first, half, softmax_scale, HALF_N,
               HEAD_DIM)


@gluon.jit
def _dkdv_buffers(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr,
                  HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The dK/dV kernels' (dense and block-sparse) Q/dO/LSE/D ring, K and V halves and their
    mbarriers, allocated and initialised: (q_smem, do_smem, k_smem, v_smem, lse_smem,
    delta_smem, kv_ready, q_ready, do_ready, empty)."""
    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem = q_ring_buffers(
        q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M, HALF_N, HEAD_DIM, NUM_STAGES, True)
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready, do_ready, empty = q_ring_barriers(NUM_STAGES)
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
    init_q_ring_barriers(q_ready, do_ready, empty, NUM_STAGES)
    fence_async_shared()
    return q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty


@gluon.jit
def _dkdv_kernel(
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc,
    heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """dK, dV (B, Hkv, Sk, D) of one BLOCK_N-key tile of one kv head.

    Grid: num_n_blocks * B * Hkv programs, key tiles fastest (under CAUSAL in groups of heads_per_group
    kv heads, heads fastest within a group: key_tile_of_program); num_warps=4. Descriptors:
    q/do over (B, Hq, Sq, D) with (1, 1, BLOCK_M, D) blocks; k/v/dk/dv over (B, Hkv, Sk, D)
    with (1, 1, BLOCK_N / 2, D); lse/delta over the (B*Hq, S_pad) float32 buffers with (1, BLOCK_M).
    """
    gl.static_assert(num_warps == 4)
    HALF_N: gl.constexpr = BLOCK_N // 2
    batch, head_kv, n_start, first_tile, n_q_tiles, n_q_blocks = key_tile_of_program(
        gl.program_id(0), num_n_blocks, heads_per_group, heads_kv, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)

    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty = _dkdv_buffers(
        q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M, HALF_N, HEAD_DIM, NUM_STAGES)

    gl.warp_specialize([
        (_dkdv_consumer, (0, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready,
                          empty, dk_desc, dv_desc, batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles,
                          n_q_blocks, group_size, qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES,
                          CAUSAL)),
        (_dkdv_consumer, (1, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready,
                          empty, dk_desc, dv_desc, batch, head_kv, n_start, seqlen_q, seqlen_k, first_tile, n_q_tiles,
                          n_q_blocks, group_size, qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES,
                          CAUSAL)),
        (_dkdv_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                        lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty, batch, head_kv, n_start, heads_q,
                        group_size, first_tile, n_q_tiles, n_q_blocks, HALF_N, BLOCK_M, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


@gluon.jit
def _dkdv_listed_loader(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc,
                        q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                        kv_ready, q_ready, do_ready, empty,
                        batch, head_kv, n_start, heads_q, group_size, idx_base, count_base, stride_ih, stride_ch,
                        HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    """One warp: K, V halves once; then, for each query head of the group, (Q, lse2) and
    (dO, Delta) of the Q tiles its block-mask list names, step ``it`` into slot it % NUM_STAGES."""
    load_kv_halves(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, head_kv, n_start, HALF_N)
    it = 0
    for g in range(group_size):
        head = head_kv * group_size + g
        tiles = idx_base + head.to(gl.int64) * stride_ih
        row = batch * heads_q + head
        for t in range(gl.load(count_base + head * stride_ch)):
            m_start = gl.load(tiles + t) * BLOCK_M
            slot = it % NUM_STAGES
            # a fresh mbarrier has completed the phase "before 0": the first lap passes at once
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) & 1) ^ 1)
            load_q_side_tile(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready,
                             do_ready, slot, batch, head, row, m_start)
            it += 1


@gluon.jit
def _dkdv_listed_consumer(half: gl.constexpr, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                          kv_ready, q_ready, do_ready, empty, dk_desc, dv_desc,
                          batch, head_kv, n_start, seqlen_q, seqlen_k, group_size, idx_base, count_base, partial_base,
                          stride_ih, stride_ch, mask_buffer, qk_scale, softmax_scale,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr,
                          NUM_STAGES: gl.constexpr, MASK_MOD: gl.constexpr):
    """_dkdv_consumer over the block mask's lists: keys [n_start + half*HALF_N, +HALF_N), the
    listed Q tiles of each query head of the group, the partial ones (listed first) masked."""
    key_first, keys, k_tile, v_tile, dk, dv, s_zero = _dkdv_consumer_start(half, k_smem, v_smem, kv_ready, n_start,
                                                                           HEAD_DIM, BLOCK_M, HALF_N)
    it = 0
    for g in range(group_size):
        head = head_kv * group_size + g
        tiles = idx_base + head.to(gl.int64) * stride_ih
        n_partial = gl.load(partial_base + head * stride_ch)
        for t in range(gl.load(count_base + head * stride_ch)):
            m_start = gl.load(tiles + t) * BLOCK_M
            slot = it % NUM_STAGES
            phase = (it // NUM_STAGES) & 1
            q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            mbarrier.wait(q_ready.index(slot), phase)
            mbarrier.wait(do_ready.index(slot), phase)
            dk, dv = _dkdv_tile(k_tile, v_tile, q_tile, do_tile, lse_smem, delta_smem, slot, dk, dv, s_zero, keys,
                                key_first, m_start, 0, qk_scale, None, HALF_N, BLOCK_M, HEAD_DIM, False, False,
                                t < n_partial, batch, head, seqlen_q, seqlen_k, mask_buffer, MASK_MOD)
            mbarrier.arrive(empty.index(slot), count=1)
            it += 1

    # Epilogue as _dkdv_consumer's: K and V halves are dead, dK and dV staged there.
    store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, batch, head_kv, key_first, half, softmax_scale, HALF_N,
               HEAD_DIM)


@gluon.jit
def _dkdv_listed_kernel(
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc,
    QIdx, QPartial, QCount, QOrder, MaskBuf, stride_ib, stride_ih, stride_im, stride_cb, stride_ch,
    heads_q, heads_kv, group_size, seqlen_q, seqlen_k, num_n_blocks, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    MASK_MOD: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """_dkdv_kernel over a block mask's dK/dV lists (BlockMask.lists("dkdv"): per BLOCK_N-key
    tile and query head, the BLOCK_M-row Q tiles that see it, partial ones first; B' and H' of
    the lists 1 with strides 0 where the mask ignores b or h). The key tiles run in the order of
    the group's first query head's schedule (QOrder), the most visited first. A key tile no query
    sees writes dK = dV = 0. Descriptors and grid as _dkdv_kernel's."""
    gl.static_assert(num_warps == 4)
    HALF_N: gl.constexpr = BLOCK_N // 2
    pid = gl.program_id(0)
    bh = pid // num_n_blocks
    batch = bh // heads_kv
    head_kv = bh % heads_kv
    counts = batch * stride_cb
    kv_tile = gl.load(QOrder + counts + head_kv * group_size * stride_ch + pid % num_n_blocks)
    n_start = kv_tile * BLOCK_N
    idx_base = QIdx + batch.to(gl.int64) * stride_ib + kv_tile * stride_im
    count_base = QCount + counts + kv_tile
    partial_base = QPartial + counts + kv_tile

    q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty = _dkdv_buffers(
        q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M, HALF_N, HEAD_DIM, NUM_STAGES)

    gl.warp_specialize([
        (_dkdv_listed_consumer, (0, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready,
                                 do_ready, empty, dk_desc, dv_desc, batch, head_kv, n_start, seqlen_q, seqlen_k,
                                 group_size, idx_base, count_base, partial_base, stride_ih, stride_ch, MaskBuf,
                                 qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, MASK_MOD)),
        (_dkdv_listed_consumer, (1, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_ready, q_ready,
                                 do_ready, empty, dk_desc, dv_desc, batch, head_kv, n_start, seqlen_q, seqlen_k,
                                 group_size, idx_base, count_base, partial_base, stride_ih, stride_ch, MaskBuf,
                                 qk_scale, softmax_scale, HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, MASK_MOD)),
        (_dkdv_listed_loader, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem,
                               lse_smem, delta_smem, kv_ready, q_ready, do_ready, empty, batch, head_kv, n_start,
                               heads_q, group_size, idx_base, count_base, stride_ih, stride_ch, HALF_N, BLOCK_M,
                               NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# ----------------------------------------------------------------------------------------------
# dQ
# ----------------------------------------------------------------------------------------------


@gluon.jit
def row_stats(Out_rows, DO_rows, LSE_row, DLSE_row, LSE2_row, Delta_row, first_row, seqlen_q, head_dim,
              stride_om, stride_dom, row_layout: gl.constexpr, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr,
              HAS_DLSE: gl.constexpr):
    """lse2 = LSE·log2(e) and Delta = rowsum(dO ∘ O) − dLSE of query rows [first_row, +ROWS) of
    one (batch, head), stored to the padded stats rows for the dK/dV kernel and returned in
    ``row_layout``. Out_rows/DO_rows: that head's (Sq, head_dim) rows of O and dO (row strides
    stride_om, stride_dom, unit column stride); LSE_row, DLSE_row: its Sq rows of the forward's
    LSE and of the LSE's gradient (HAS_DLSE). Rows past seqlen_q and rows that saw no key (LSE
    = −inf) get lse2 = +inf, so their P is exactly 0, and rows past the end Delta = 0.

    The columns go 64 at a time, so the float32 products never hold more than 32 registers per
    thread beside the dQ accumulator (128 at d256)."""
    CHUNK: gl.constexpr = 64 if HEAD_DIM >= 64 else HEAD_DIM
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16 rows x 64 columns a pass
    rows = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    inside = rows < seqlen_q
    o_rows = Out_rows + rows.to(gl.int64)[:, None] * stride_om
    do_rows = DO_rows + rows.to(gl.int64)[:, None] * stride_dom
    delta = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(HEAD_DIM // CHUNK):
        cols = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
        mask = inside[:, None] & (cols[None, :] < head_dim)  # a head dim below the kernel's width
        o = gl.load(o_rows + cols[None, :], mask=mask, other=0.0).to(gl.float32)
        do = gl.load(do_rows + cols[None, :], mask=mask, other=0.0).to(gl.float32)
        delta += gl.sum(o * do, axis=1)
    if HAS_DLSE:  # dLSE_i/dS_ij = P_ij: a gradient into the LSE only shifts Delta
        delta -= gl.load(DLSE_row + rows, mask=inside, other=0.0)
    lse = gl.load(LSE_row + rows, mask=inside, other=float("-inf"))
    lse2 = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    gl.store(LSE2_row + rows, lse2)  # (every padded row: S_pad is a multiple of the dQ tiles)
    gl.store(Delta_row + rows, delta)
    return gl.convert_layout(lse2, row_layout), gl.convert_layout(delta, row_layout)


@gluon.jit
def _dq_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
               q_ready, k_ready, v_ready, k_empty, v_empty,
               batch, head, head_kv, q_start, n_tiles, tiles,
               HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """One warp: Q and dO halves once, then K and V tile j (or tiles[j], a block mask's list)
    into slot j % NUM_STAGES."""
    mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
    for h in gl.static_range(2):
        tma_load(q_desc, [batch, head, q_start + h * HALF_M, 0], q_ready, q_smem.index(h))
        tma_load(do_desc, [batch, head, q_start + h * HALF_M, 0], q_ready, do_smem.index(h))
    stream_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, head_kv, n_tiles,
                    BLOCK_N, NUM_STAGES, tiles)


@gluon.jit
def _dq_consumer(half: gl.constexpr, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty,
                 dq_desc, stats, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale,
                 softmax_scale, tiles, n_masked, mask_buffer, HEAD_DIM: gl.constexpr, HALF_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_MOD: gl.constexpr,
                 ROW_STATS: gl.constexpr, HAS_DLSE: gl.constexpr):
    """One warpgroup: query rows [q_start + half*HALF_M, +HALF_M), every K/V tile (under
    MASK_MOD a block mask's list: see gluon_common.hide_scores). ``stats``: row_stats'
    pointers and sizes, (Out_rows, DO_rows, LSE_row, DLSE_row, LSE2_row, Delta_row, head_dim,
    stride_om, stride_dom), or without ROW_STATS (LSE2_row, Delta_row), the preprocess's rows."""
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_N)  # S, dP: HALF_M x BLOCK_N
    q_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)  # dQ: HALF_M x HEAD_DIM
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=q_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = q_smem.dtype

    first_row = q_start + half * HALF_M
    rows = first_row + gl.arange(0, HALF_M, layout=row_layout)
    shift = seqlen_k - seqlen_q
    if ROW_STATS:
        Out_rows, DO_rows, LSE_row, DLSE_row, LSE2_row, Delta_row, head_dim, stride_om, stride_dom = stats
        lse2, delta = row_stats(Out_rows, DO_rows, LSE_row, DLSE_row, LSE2_row, Delta_row, first_row, seqlen_q,
                                head_dim, stride_om, stride_dom, row_layout, HALF_M, HEAD_DIM, HAS_DLSE)
    else:  # the preprocess's padded rows (S_pad, a multiple of 128): no mask; padding rows have lse2 = +inf
        LSE2_row, Delta_row = stats
        lse2 = gl.load(LSE2_row + rows)
        delta = gl.load(Delta_row + rows)
    q_tile = q_smem.index(half).reshape([HALF_M, HEAD_DIM])
    do_tile = do_smem.index(half).reshape([HALF_M, HEAD_DIM])
    dq = gl.zeros([HALF_M, HEAD_DIM], gl.float32, layout=q_layout)
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_ready, 0)
    for j in range(n_tiles):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        tile_start = j * BLOCK_N
        k_tile = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        v_tile = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        mbarrier.wait(k_ready.index(slot), phase)
        mbarrier.wait(v_ready.index(slot), phase)
        run = True
        if CAUSAL:  # warpgroup 0 may see none of the CTA's last tile
            run = tile_start <= first_row + HALF_M - 1 + shift
        if run:
            s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            s = s * qk_scale - lse2[:, None]
            # Dense: only tiles crossing the end of the keys (rows of K are zero there, but P must
            # be 0 so no inf * 0 can reach dQ) or the causal diagonal are masked; listed: a block
            # mask's partial tiles (full ones never reach past the keys' end).
            s = hide_scores(s, rows, j, seqlen_q, seqlen_k, shift, first_row + shift, s_layout, BLOCK_N, CAUSAL,
                            tiles, n_masked, batch, head, mask_buffer, MASK_MOD)
            p = gl.exp2(s)
            dp = warpgroup_mma_wait(0, deps=(dp, ))
            ds = p * (dp - delta[:, None])
            ds16 = gl.convert_layout(ds.to(dtype), a_layout, assert_trivial=True)
            dq = warpgroup_mma(ds16, k_tile, dq, is_async=True)
            dq, ds16 = warpgroup_mma_wait(0, deps=(dq, ds16))
        mbarrier.arrive(v_empty.index(slot), count=1)
        mbarrier.arrive(k_empty.index(slot), count=1)

    # Q's half is dead: stage dQ there for the TMA store (clipped at the sequence's end).
    q_tile.store((dq * softmax_scale).to(dtype))
    fence_async_shared()
    tma_store(dq_desc, [batch, head, first_row, 0], q_smem.index(half))
    tma.store_wait(0)


@gluon.jit
def _row_stats_pointers(Out, DO, LSE, DLSE, LSE2, Delta, batch, head, bh, stride_lrow, stride_ob, stride_oh,
                        stride_om, stride_dob, stride_doh, stride_dom, stride_lb, stride_lh, head_dim,
                        ROW_STATS: gl.constexpr):
    """The dQ consumers' ``stats`` for one (batch, head), ``bh`` = batch · Hq + head: with
    ROW_STATS row_stats' pointers to its rows and the sizes, (Out_rows, DO_rows, LSE_row,
    DLSE_row, LSE2_row, Delta_row, head_dim, stride_om, stride_dom); without it (Out to head_dim
    are then None) only (LSE2_row, Delta_row)."""
    padded_offset = bh.to(gl.int64) * stride_lrow
    if ROW_STATS:
        batch64 = batch.to(gl.int64)
        head64 = head.to(gl.int64)
        lse_offset = batch64 * stride_lb + head64 * stride_lh
        stats = (Out + batch64 * stride_ob + head64 * stride_oh, DO + batch64 * stride_dob + head64 * stride_doh,
                 LSE + lse_offset, DLSE + lse_offset, LSE2 + padded_offset, Delta + padded_offset, head_dim,
                 stride_om, stride_dom)
    else:
        stats = (LSE2 + padded_offset, Delta + padded_offset)
    return stats


@gluon.jit
def _dq_buffers(q_desc, do_desc, k_desc, v_desc, HALF_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The dQ kernels' Q and dO halves, K/V ring and mbarriers, allocated and initialised:
    (q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, HALF_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, HALF_M, HEAD_DIM], do_desc.layout)
    k_smem, v_smem = kv_ring_buffers(k_desc, v_desc, BLOCK_N, HEAD_DIM, NUM_STAGES)
    q_ready, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(NUM_STAGES)
    fence_async_shared()
    return q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def _dq_kernel(
    q_desc, do_desc, k_desc, v_desc, dq_desc, LSE2, Delta, stride_lrow,
    Out, DO, LSE, DLSE, stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_lb, stride_lh,
    head_dim, heads_q, group_size, seqlen_q, seqlen_k, num_m_blocks, heads_per_group, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, ROW_STATS: gl.constexpr, HAS_DLSE: gl.constexpr, LOADER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """dQ (B, Hq, Sq, D) of one BLOCK_M-row Q tile of one head, and that tile's lse2 and Delta.

    Grid: num_m_blocks * B * Hq, Q tiles fastest (under CAUSAL in groups of heads_per_group heads,
    heads fastest within a group: q_tile_of_program); num_warps=4. Descriptors: q/do/dq over
    (B, Hq, Sq, D) with (1, 1, BLOCK_M / 2, D) blocks, k/v over (B, Hkv, Sk, D) with
    (1, 1, BLOCK_N, D). LSE2, Delta: (B*Hq, S_pad) float32, row stride stride_lrow, written
    here from Out, DO: (B, Hq, Sq, head_dim) with unit column stride, and LSE, DLSE: the
    forward's (B, Hq, Sq) LSE and its gradient (HAS_DLSE), unit row stride (ROW_STATS: see
    row_stats), or read as the preprocess wrote them (without it: Out to head_dim are then None).
    """
    gl.static_assert(num_warps == 4)
    HALF_M: gl.constexpr = BLOCK_M // 2
    batch, head, head_kv, q_start, kv_end = q_tile_of_program(gl.program_id(0), num_m_blocks, heads_per_group, heads_q,
                                                              group_size, seqlen_q, seqlen_k, BLOCK_M, CAUSAL)
    n_tiles = gl.cdiv(kv_end, BLOCK_N)  # may be 0 (causal, Sq > Sk): dQ = 0 is written
    stats = _row_stats_pointers(Out, DO, LSE, DLSE, LSE2, Delta, batch, head, batch * heads_q + head, stride_lrow,
                                stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_lb,
                                stride_lh, head_dim, ROW_STATS)
    q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty = _dq_buffers(
        q_desc, do_desc, k_desc, v_desc, HALF_M, HEAD_DIM, BLOCK_N, NUM_STAGES)

    gl.warp_specialize([
        (_dq_consumer, (0, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, dq_desc,
                        stats, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale,
                        softmax_scale, None, 0, None, HEAD_DIM, HALF_M, BLOCK_N, NUM_STAGES, CAUSAL, None, ROW_STATS,
                        HAS_DLSE)),
        (_dq_consumer, (1, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, dq_desc,
                        stats, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale,
                        softmax_scale, None, 0, None, HEAD_DIM, HALF_M, BLOCK_N, NUM_STAGES, CAUSAL, None, ROW_STATS,
                        HAS_DLSE)),
        (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                      k_empty, v_empty, batch, head, head_kv, q_start, n_tiles, None, HALF_M, BLOCK_N, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


@gluon.jit
def _dq_listed_kernel(
    q_desc, do_desc, k_desc, v_desc, dq_desc, LSE2, Delta, stride_lrow,
    Out, DO, LSE, DLSE, stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_lb, stride_lh,
    head_dim, KvIdx, KvPartial, KvCount, KvOrder, MaskBuf, stride_ib, stride_ih, stride_im, stride_cb, stride_ch,
    heads_q, group_size, seqlen_q, seqlen_k, num_m_blocks, qk_scale, softmax_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    MASK_MOD: gl.constexpr, ROW_STATS: gl.constexpr, HAS_DLSE: gl.constexpr, LOADER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """_dq_kernel over a block mask's dQ lists (BlockMask.lists("dq"): BLOCK_M-row Q tiles,
    BLOCK_N-key tiles, laid out as gluon_fwd._fwd_listed_kernel's), the partial tiles masked by
    MASK_MOD. A Q tile with an empty list writes dQ = 0 (and under ROW_STATS its rows' lse2 and Delta)."""
    gl.static_assert(num_warps == 4)
    HALF_M: gl.constexpr = BLOCK_M // 2
    batch, head, block_m, n_masked, n_tiles, tiles = listed_q_tile_of_program(
        gl.program_id(0), num_m_blocks, heads_q, KvIdx, KvPartial, KvCount, KvOrder, stride_ib, stride_ih, stride_im,
        stride_cb, stride_ch)
    q_start = block_m * BLOCK_M
    stats = _row_stats_pointers(Out, DO, LSE, DLSE, LSE2, Delta, batch, head, gl.program_id(0) // num_m_blocks,
                                stride_lrow, stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom,
                                stride_lb, stride_lh, head_dim, ROW_STATS)
    q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty = _dq_buffers(
        q_desc, do_desc, k_desc, v_desc, HALF_M, HEAD_DIM, BLOCK_N, NUM_STAGES)

    gl.warp_specialize([
        (_dq_consumer, (0, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, dq_desc,
                        stats, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale,
                        softmax_scale, tiles, n_masked, MaskBuf, HEAD_DIM, HALF_M, BLOCK_N, NUM_STAGES, False,
                        MASK_MOD, ROW_STATS, HAS_DLSE)),
        (_dq_consumer, (1, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, dq_desc,
                        stats, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale,
                        softmax_scale, tiles, n_masked, MaskBuf, HEAD_DIM, HALF_M, BLOCK_N, NUM_STAGES, False,
                        MASK_MOD, ROW_STATS, HAS_DLSE)),
        (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                      k_empty, v_empty, batch, head, head // group_size, q_start, n_tiles, tiles, HALF_M, BLOCK_N,
                      NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
