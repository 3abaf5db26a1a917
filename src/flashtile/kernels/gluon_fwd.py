"""Hopper forward in Gluon: one TMA loader warp and two ping-pong consumer warpgroups.

The plain Triton forward (fwd.py) leaves the schedule to the compiler; on sm_90 that gives
one instruction stream where the softmax waits for the matmuls. This kernel spells the
schedule out, as FlashAttention-3 does, in Triton's Gluon dialect:

- a **loader** warp issues every copy: Q once, then K and V tiles through a ring of
  NUM_STAGES shared-memory slots, each slot with a "ready" mbarrier (the copy landed) and
  an "empty" one (both consumers are done with it);
- two **consumer** warpgroups (4 warps each) own 64 query rows apiece. Each computes
  S = Q Kᵀ and O += P V with wgmma, P fed from registers, and runs the online softmax.
  Being separate partitions, they only meet at the "empty" barriers, so one's softmax
  overlaps the other's matmuls (measured: attempt 26 in docs/performance.md). With
  CONSUMERS = 3 (d64 under auto; on 128-key tiles with each tile's products in turn,
  1.03-1.11x two consumers on the H200 but for the causal 1k cell, 0.96x) three of them
  share a 192-row tile, and with CONSUMERS = 4 (a switch's; 64-key tiles) four a 256-row one.

Tiles travel through 4-D tensor descriptors of the (B, H, S, D) views, so any strides
TMA can address work (bshd or bhsd), rows past a sequence's end arrive as zeros and the
output's TMA store stops at its edge. Within a warpgroup, S of tile j+1 is issued before
O += P_j V_j as FlashAttention-3 orders them (OVERLAP), but ptxas moves the wait for that product
ahead of the exponentials (sm_90 SASS, triton 3.6 and 3.9), so the overlap comes from the
other warpgroup; three consumers run the two products in turn, which keeps S, P and O from being
live at once and so 128-key tiles within 160 registers. The layout conversions (alpha and 1/l
to the output's rows, P to wgmma's operand layout) are asserted to move no data: shared memory
is nearly full at d128 with 3 stages, and a conversion through it would not fit.

Covered: dense batches, bf16/fp16, head dims 64, 128 and 256, any lengths,
causal (bottom-right aligned) or not, GQA. ``_fwd_listed_kernel`` runs the same partitions
over a block mask's tile lists (block_mask.py): the loader copies the listed K/V tiles, and
the consumers evaluate the user's mask_mod, compiled into them, on the partial tiles only, as
fwd.py does. Everything else runs on fwd.py. There is no interpreter for Gluon: the tests of
these kernels run on a GPU.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from .gluon_common import (accumulator_layout, hide_scores, kv_ring_barriers, kv_ring_buffers,
                           listed_q_tile_of_program, q_tile_of_program, read_slot, stream_kv_tiles, tma_load,
                           tma_store, write_slot)


LN2 = gl.constexpr(0.6931471805599453)

# The consumers' timeline (a probe's, probes/fwd_timeline.py; off unless a Trace buffer is passed):
# for each of the first TRACE_PROGRAMS persistent programs' first TRACE_ITEMS work items and each
# consumer, TRACE_EVENTS clock64 stamps: 0 before _consumer's wait for Q, 1 after it (on the dynamic
# scheduler the consumer has already waited for Q, to read the item, so these two read nothing of
# that wait; under EARLY_COORDS _consume_item stamps them around its wait and reads the item's
# coordinates after 1, where without it they are worked out before 0), then, where the products
# run in turn (not under OVERLAP, which stamps only 0, 1 and
# the epilogue), for K/V tile j in slot t = min(j, TRACE_TILES - 1) (the last slot holds the item's
# last tile): 2 + 4t K ready, 3 + 4t S done, 4 + 4t P ready, 5 + 4t P V done; then the epilogue's:
# TRACE_EVENTS - 4 its start, TRACE_EVENTS - 3 O staged in shared memory (fenced), TRACE_EVENTS - 2
# its store issued, TRACE_EVENTS - 1 its end (the store's wait done). The epilogue's middle two only
# where the part stores rows.
TRACE_PROGRAMS = gl.constexpr(8)
TRACE_ITEMS = gl.constexpr(8)
TRACE_TILES = gl.constexpr(8)
TRACE_EVENTS = gl.constexpr(2 + 4 * TRACE_TILES.value + 4)


@gluon.jit
def _stamp(Trace, event, keep):
    """The SM's clock64 into Trace[event] (int64) where ``keep``; nothing without a Trace."""
    if Trace is not None:
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        zero = gl.full([1], 0, gl.int32, layout=layout)
        now = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [zero], dtype=gl.int64, is_pure=False,
                                        pack=1)
        gl.store(Trace + event + zero, now, mask=keep & (zero == 0))


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty,
            batch, head, head_kv, q_start, n_tiles, tiles, PART_M: gl.constexpr, BLOCK_N: gl.constexpr,
            NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """One warp: the Q tile's CONSUMERS parts of PART_M rows, then K and V tile j (or tiles[j],
    a block mask's list) into slot j % NUM_STAGES once every consumer has released the slot's
    previous tile."""
    mbarrier.expect(q_ready, CONSUMERS * q_desc.block_type.nbytes)
    for part in gl.static_range(CONSUMERS):
        tma_load(q_desc, [batch, head, q_start + part * PART_M, 0], q_ready, q_smem.index(part))
    stream_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, head_kv, n_tiles,
                    BLOCK_N, NUM_STAGES, tiles)


@gluon.jit
def _softmax_update(s, m_i, l_i, qk_scale):
    """One online-softmax step on the raw scores s (rows × keys, float32, before the softmax
    scale, hidden ones at -inf; qk_scale = softmax_scale · log2(e)).

    Returns P (unnormalised, float32), the factor alpha that rescales the running output,
    and the new running max (log2 units) and sum.
    """
    # The scale is applied to the row maxima (exactly max(s · qk_scale): qk_scale > 0) and
    # folded into the exponent's argument, s · qk_scale − m, which is one FFMA per score
    # instead of a multiply and a subtraction, as FlashAttention-3 does.
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    # A row that has seen no key yet keeps m = -inf; exp2(-inf - 0) = 0 instead of NaN.
    m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def _rescaled_with_operand(acc, alpha, p, o_rows: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr):
    """O rescaled by the softmax step's alpha, and P in the inputs' dtype and wgmma's register-operand
    layout: what O += P V takes. Both conversions are asserted to move no data."""
    acc = acc * gl.convert_layout(alpha, o_rows, assert_trivial=True)[:, None]
    return acc, gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)


@gluon.jit
def _overlapped_tiles(q_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, rows, seqlen_q, seqlen_k, shift,
                      diagonal, n_tiles, first, qk_scale, tiles, n_masked, batch, head, mask_buffer, m_i, l_i, acc,
                      s_zero, s_layout: gl.constexpr, o_rows: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr,
                      BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                      MASK_MOD: gl.constexpr):
    """A consumer's K/V tiles in FlashAttention-3's order (_consumer's OVERLAP), tile j in ring
    slot (first + j) % NUM_STAGES: returns O (unnormalised), the running max and sum."""
    # Tile 0: S and its softmax (n_tiles >= 1 always: see the kernel).
    mbarrier.wait(k_ready.index(first % NUM_STAGES), (first // NUM_STAGES) & 1)
    s = warpgroup_mma(q_tile, k_smem.index(first % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(first % NUM_STAGES), count=1)
    s = hide_scores(s, rows, 0, seqlen_q, seqlen_k, shift, diagonal, s_layout, BLOCK_N, CAUSAL, tiles, n_masked,
                     batch, head, mask_buffer, MASK_MOD)
    p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale)
    for j in range(1, n_tiles):
        slot = (first + j) % NUM_STAGES
        previous = (first + j - 1) % NUM_STAGES
        # Issue S_j = Q K_jᵀ, then O += P_{j-1} V_{j-1}; wait for S_j alone and run its
        # softmax while the second product is in flight.
        mbarrier.wait(k_ready.index(slot), ((first + j) // NUM_STAGES) & 1)
        s = warpgroup_mma(q_tile, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                          use_acc=False, is_async=True)
        acc, p_low = _rescaled_with_operand(acc, alpha, p, o_rows, p_layout, dtype)
        mbarrier.wait(v_ready.index(previous), ((first + j - 1) // NUM_STAGES) & 1)
        acc = warpgroup_mma(p_low, v_smem.index(previous).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s, ))
        mbarrier.arrive(k_empty.index(slot), count=1)
        s = hide_scores(s, rows, j, seqlen_q, seqlen_k, shift, diagonal, s_layout, BLOCK_N, CAUSAL, tiles, n_masked,
                         batch, head, mask_buffer, MASK_MOD)
        p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale)
        acc, p_low = warpgroup_mma_wait(0, deps=(acc, p_low))
        mbarrier.arrive(v_empty.index(previous), count=1)
    last = (first + n_tiles - 1) % NUM_STAGES
    acc, p_low = _rescaled_with_operand(acc, alpha, p, o_rows, p_layout, dtype)
    mbarrier.wait(v_ready.index(last), ((first + n_tiles - 1) // NUM_STAGES) & 1)
    acc = warpgroup_mma(p_low, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    acc, p_low = warpgroup_mma_wait(0, deps=(acc, p_low))
    mbarrier.arrive(v_empty.index(last), count=1)
    return acc, m_i, l_i


@gluon.jit
def _in_turn_tile(j, q_regs, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, first, rows, seqlen_q, seqlen_k,
                  shift, diagonal, qk_scale, tiles, n_masked, batch, head, mask_buffer, m_i, l_i, acc, s_zero,
                  s_layout: gl.constexpr, o_rows: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr,
                  BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  MASK_MOD: gl.constexpr, Trace, traced):
    """A consumer's K/V tile j, its two products one after the other (_consumer without OVERLAP),
    in ring slot (first + j) % NUM_STAGES: returns Q's registers, the running max and sum and O."""
    slot = (first + j) % NUM_STAGES
    phase = ((first + j) // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    _stamp(Trace, 2 + 4 * gl.minimum(j, TRACE_TILES - 1), traced)
    s = warpgroup_mma(q_regs, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    if BLOCK_N == HEAD_DIM:
        # Where P's operand has Q's shape, ptxas of CUDA 12.8 (Triton 3.6's) and 12.9 gave
        # it Q's registers and never put Q back, so every tile after the first took P as Q
        # (session 28: d64 on 64-key tiles with any count of consumers, d128 on 128-key
        # tiles; 13.4's, which Triton 3.9 compiles sm_90 with, keeps them apart). Q passed
        # through the wait as the product's operand stays apart (16 moves a tile); where
        # the shapes differ it does anyway (the SASS unchanged there).
        # tools/sass_operands.py checks every forward build for this.
        s, q_regs = warpgroup_mma_wait(0, deps=(s, q_regs))
    else:
        s = warpgroup_mma_wait(0, deps=(s, ))
    _stamp(Trace, 3 + 4 * gl.minimum(j, TRACE_TILES - 1), traced)
    mbarrier.arrive(k_empty.index(slot), count=1)
    s = hide_scores(s, rows, j, seqlen_q, seqlen_k, shift, diagonal, s_layout, BLOCK_N, CAUSAL, tiles,
                     n_masked, batch, head, mask_buffer, MASK_MOD)
    p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i, qk_scale)
    acc, p_low = _rescaled_with_operand(acc, alpha, p, o_rows, p_layout, dtype)
    _stamp(Trace, 4 + 4 * gl.minimum(j, TRACE_TILES - 1), traced)
    mbarrier.wait(v_ready.index(slot), phase)
    acc = warpgroup_mma(p_low, v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    acc, p_low = warpgroup_mma_wait(0, deps=(acc, p_low))
    _stamp(Trace, 5 + 4 * gl.minimum(j, TRACE_TILES - 1), traced)
    mbarrier.arrive(v_empty.index(slot), count=1)
    return q_regs, m_i, l_i, acc


@gluon.jit
def _pass_tile(j, k_ready, v_ready, k_empty, v_empty, first, NUM_STAGES: gl.constexpr):
    """K/V tile j waited for and released without a product, so that the ring's phases stay in
    step with the other consumers'."""
    slot = (first + j) % NUM_STAGES
    phase = ((first + j) // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    mbarrier.arrive(k_empty.index(slot), count=1)
    mbarrier.wait(v_ready.index(slot), phase)
    mbarrier.arrive(v_empty.index(slot), count=1)


@gluon.jit
def _live_tiles(first_row, n_tiles, seqlen_q, seqlen_k, PART_M: gl.constexpr, BLOCK_N: gl.constexpr,
                CAUSAL: gl.constexpr):
    """How many of the Q tile's ``n_tiles`` K/V tiles a consumer of rows [first_row, +PART_M) needs.
    None when every row lies past the sequence's end (the last Q tile of a length that is not a
    multiple of BLOCK_M; at d64's 192-row tiles up to two of the three consumers), or before its
    start (under CAUSAL those parts are moved to the first tile: q_tile_of_program's LEAD_PART).
    Otherwise, under CAUSAL, the tiles up to its own last row's diagonal, where the Q tile's count
    runs to the tile's last row (a 64-row part of a 192-row tile on 128-key tiles can end a tile
    earlier). The tiles after them are fully hidden from these rows: computing them would only add
    zeros."""
    live = n_tiles
    if CAUSAL:
        ends = gl.minimum(seqlen_k, gl.maximum(first_row + PART_M + seqlen_k - seqlen_q, 0))
        live = gl.minimum(gl.cdiv(ends, BLOCK_N), n_tiles)
    if (first_row >= seqlen_q) | (first_row + PART_M <= 0):
        live = 0
    return live


@gluon.jit
def _consumer(part: gl.constexpr, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, o_desc,
              LSE_head, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale, tiles, n_masked, mask_buffer,
              HEAD_DIM: gl.constexpr, PART_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, MASK_MOD: gl.constexpr, OVERLAP: gl.constexpr, q_index, q_phase, first,
              Trace=None, traced=False, Q_WAITED: gl.constexpr = False):
    """One warpgroup: rows [q_start + part·PART_M, +PART_M) of the Q tile, every K/V tile (or
    under MASK_MOD the block mask's list: see hide_scores). OVERLAP: S of tile j+1 issued before
    O += P_j V_j (FlashAttention-3's order; S, P and O live at once); without it each tile's two
    products run one after the other, S dead before O's product (fewer live registers), and S
    takes Q from registers, loaded once.
    A persistent program's work item: its rows in Q buffer ``q_index``, landed on q_ready's phase
    ``q_phase``, its tiles after the ``first`` that went round the K/V ring before them. ``Trace``:
    this item's and part's TRACE_EVENTS stamps, kept where ``traced`` (see TRACE_EVENTS). Q_WAITED:
    the caller has waited for q_ready (and stamped 0 and 1), to read what the loader wrote with Q."""
    s_layout: gl.constexpr = accumulator_layout(4, BLOCK_N)
    o_layout: gl.constexpr = accumulator_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype

    first_row = q_start + part * PART_M
    rows = first_row + gl.arange(0, PART_M, layout=s_rows)
    shift = seqlen_k - seqlen_q
    diagonal = first_row + shift
    q_tile = q_smem.index(q_index).reshape([PART_M, HEAD_DIM])
    m_i = gl.full([PART_M], -float("inf"), gl.float32, layout=s_rows)
    l_i = gl.full([PART_M], 0.0, gl.float32, layout=s_rows)
    acc = gl.zeros([PART_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([PART_M, BLOCK_N], gl.float32, layout=s_layout)

    if not Q_WAITED:
        _stamp(Trace, 0, traced)
        mbarrier.wait(q_ready, q_phase)
        _stamp(Trace, 1, traced)
    if OVERLAP:
        acc, m_i, l_i = _overlapped_tiles(q_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, rows, seqlen_q,
                                          seqlen_k, shift, diagonal, n_tiles, first, qk_scale, tiles, n_masked, batch,
                                          head,
                                          mask_buffer, m_i, l_i, acc, s_zero, s_layout, o_rows, p_layout, dtype,
                                          BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, MASK_MOD)
    else:
        # Tiles past n_live hold no key any of this warpgroup's rows sees (_live_tiles): they are
        # only waited for and released, so that the ring's phases stay in step with the others'.
        n_live = n_tiles
        if tiles is None:
            n_live = _live_tiles(first_row, n_tiles, seqlen_q, seqlen_k, PART_M, BLOCK_N, CAUSAL)
        # Q comes into registers once (16 a thread at d64) and S = Q Kᵀ takes it from there, as
        # P V takes P, so each tile's product reads only K from shared memory: 1.01-1.02x at 1k
        # and 4k keys (session 27, attempt 68), with registers to spare in turn (no spill). (The two
        # loops stay written out here: a function around both moved the loader's registers in
        # three persistent builds, session 29.)
        q_regs = q_tile.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        for j in range(n_live):
            q_regs, m_i, l_i, acc = _in_turn_tile(j, q_regs, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                                                  first, rows, seqlen_q, seqlen_k, shift, diagonal, qk_scale,
                                                  tiles, n_masked, batch, head, mask_buffer, m_i, l_i, acc,
                                                  s_zero, s_layout, o_rows, p_layout, dtype, BLOCK_N, HEAD_DIM,
                                                  NUM_STAGES, CAUSAL, MASK_MOD, Trace, traced)
        for j in range(n_live, n_tiles):
            _pass_tile(j, k_ready, v_ready, k_empty, v_empty, first, NUM_STAGES)

    # Epilogue: rows that saw no key (l = 0) give O = 0 and LSE = -inf, as fwd.py does. A part
    # whose rows all lie outside the sequence (past its end, or before its start under LEAD_PART:
    # row indices below 0 would address the head before) stores nothing.
    _stamp(Trace, TRACE_EVENTS - 4, traced)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, -float("inf"), (m_i + gl.log2(l_safe)) * LN2)
    if (first_row < seqlen_q) & (first_row + PART_M > 0):
        # (rows >= 0 holds for a part that is not wholly before row 0 while the lead is whole parts;
        # the mask keeps the head before safe should it ever not be)
        gl.store(LSE_head + rows, lse, mask=(rows >= 0) & (rows < seqlen_q))
        out = acc * gl.convert_layout(1.0 / l_safe, o_rows, assert_trivial=True)[:, None]
        # Q is dead once its last product retired: its buffer stages O for the TMA store,
        # which writes only the rows inside the tensor.
        q_tile.store(out.to(dtype))
        fence_async_shared()
        _stamp(Trace, TRACE_EVENTS - 3, traced)
        tma_store(o_desc, [batch, head, first_row, 0], q_smem.index(q_index))
        _stamp(Trace, TRACE_EVENTS - 2, traced)
        tma.store_wait(0)
    _stamp(Trace, TRACE_EVENTS - 1, traced)


@gluon.jit
def _tile_consumer(part: gl.constexpr, shared, HEAD_DIM: gl.constexpr, PART_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr):
    """_consumer of a program per Q tile (dense, no block mask), ``shared`` what every consumer
    partition takes alike as one tuple (see _one_tile_per_program)."""
    q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, o_desc, LSE_head, batch, head, q_start, \
        seqlen_q, seqlen_k, n_tiles, qk_scale = shared
    _consumer(part, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, o_desc, LSE_head, batch,
              head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale, None, 0, None, HEAD_DIM, PART_M, BLOCK_N,
              NUM_STAGES, CAUSAL, None, OVERLAP, part, 0, 0)


# EARLY_COORDS: the int32 slots of each Q buffer in item_slots (_fwd_pingpong_kernel), what the loader
# works out of its item for its own copies and writes there before it arms the buffer's q_ready: the
# item (the dynamic scheduler's; num_items at the end), then its batch, head, first row and K/V tiles.
COORD_SLOTS = gl.constexpr(5)


@gluon.jit
def _item_slot(buffer, EARLY_COORDS: gl.constexpr):
    """The slot of item_slots that holds Q buffer ``buffer``'s item: its first of COORD_SLOTS under
    EARLY_COORDS, else its only one."""
    slot = buffer
    if EARLY_COORDS:
        slot = buffer * COORD_SLOTS
    return slot


@gluon.jit
def _write_coords(slots, buffer, item, batch, head, q_start, n_tiles):
    """Q buffer ``buffer``'s COORD_SLOTS slots of ``slots`` (the loader's, before it arms the buffer's
    q_ready): the item, its batch, head, first row and count of K/V tiles."""
    first = buffer * COORD_SLOTS
    write_slot(slots, first, item)
    write_slot(slots, first + 1, batch)
    write_slot(slots, first + 2, head)
    write_slot(slots, first + 3, q_start)
    write_slot(slots, first + 4, n_tiles)


@gluon.jit
def _read_coords(slots, buffer):
    """(batch, head, q_start, n_tiles) that _write_coords left in Q buffer ``buffer``'s slots: read
    once its q_ready has completed (the loader wrote them before arming it)."""
    first = buffer * COORD_SLOTS
    return (read_slot(slots, first + 1), read_slot(slots, first + 2), read_slot(slots, first + 3),
            read_slot(slots, first + 4))


@gluon.jit
def _load_item(item, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
               v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q, group_size, seqlen_q, seqlen_k, ring,
               local, PART_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, Q_BUFFERS: gl.constexpr, item_slots=None,
               EARLY_KV: gl.constexpr = False, EARLY_COORDS: gl.constexpr = False):
    """_persistent_loader's copies for work item ``item``, its ``local``-th, its K/V tiles after the
    ``ring`` that went round the ring before them: returns how many K/V tiles it has.
    ``item_slots`` (the dynamic scheduler's, a shared-memory slot per Q buffer): the item is
    written to its Q buffer's slot before the Q copy's barrier is armed, for the consumers to
    read once it completes. EARLY_KV (one Q buffer): the item's first NUM_STAGES K/V tiles are
    copied before the wait for the Q buffer, which ends only once the previous item's output has
    been stored from it; they need only ring slots the previous item's tiles free as they are
    consumed, so the ring fills while that item's last tiles and output run. EARLY_COORDS: the
    item's coordinates go to its buffer's slots with it (_write_coords), in fixed turns too, so
    that the consumers read them instead of working them out (_consume_item)."""
    batch, head, head_kv, q_start, kv_end = q_tile_of_program(item, num_m_blocks, heads_per_group, num_heads_q,
                                                              group_size, seqlen_q, seqlen_k, BLOCK_M, CAUSAL,
                                                              num_items, PART_M)
    n_tiles = gl.maximum(gl.cdiv(kv_end, BLOCK_N), 1)
    early = 0
    if EARLY_KV:
        early = gl.minimum(n_tiles, NUM_STAGES)
        stream_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, head_kv, early,
                        BLOCK_N, NUM_STAGES, None, ring)
    buffer = local % Q_BUFFERS
    mbarrier.wait(q_empty.index(buffer), ((local // Q_BUFFERS) & 1) ^ 1)  # a new barrier passes at once
    if EARLY_COORDS:
        _write_coords(item_slots, buffer, item, batch, head, q_start, n_tiles)
    elif item_slots is not None:
        write_slot(item_slots, buffer, item)
    mbarrier.expect(q_ready.index(buffer), CONSUMERS * q_desc.block_type.nbytes)
    for part in gl.static_range(CONSUMERS):
        tma_load(q_desc, [batch, head, q_start + part * PART_M, 0], q_ready.index(buffer),
                 q_smem.index(buffer * CONSUMERS + part))
    stream_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, head_kv, n_tiles,
                    BLOCK_N, NUM_STAGES, None, ring, early)
    return n_tiles


@gluon.jit
def _persistent_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                       v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q, group_size, seqlen_q, seqlen_k,
                       PART_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, Q_BUFFERS: gl.constexpr, TileCounter,
                       item_slots, EARLY_KV: gl.constexpr, EARLY_COORDS: gl.constexpr = False):
    """_loader for a persistent program: work items pid, pid + programs, ... of the grid's
    ``num_items`` (with TileCounter, the dynamic scheduler's). Item i's Q goes to buffer i % Q_BUFFERS once
    the consumers have stored the output of the item before it there (q_empty); its K/V tiles
    follow the previous item's round the same ring. With two Q buffers the next item's Q and
    first K/V tiles land while this one's last run; with one, the loader waits for this item's
    output to be stored before it copies the next one's Q, and (EARLY_KV) copies the next one's
    first NUM_STAGES K/V tiles before that wait (_load_item). EARLY_COORDS: each item's coordinates
    written beside its Q for the consumers (_write_coords)."""
    ring = 0  # K/V tiles this program has sent round the ring before the item
    local = 0  # items this program has taken before
    if TileCounter is not None:
        # The dynamic scheduler: each item is the next of a counter shared by the grid, so the items
        # running at once stay consecutive in the grid's order, as with a program per tile.
        # (relaxed: the counter only hands out numbers; nothing else is published through it)
        item = gl.atomic_add(TileCounter, 1, sem="relaxed")
        while item < num_items:
            ring += _load_item(item, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                               v_ready, k_empty, v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q,
                               group_size, seqlen_q, seqlen_k, ring, local, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES,
                               CAUSAL, CONSUMERS, Q_BUFFERS, item_slots, EARLY_KV, EARLY_COORDS)
            local += 1
            item = gl.atomic_add(TileCounter, 1, sem="relaxed")
        # The end: num_items in the next buffer's slot, its "ready" barrier completed without a copy.
        buffer = local % Q_BUFFERS
        mbarrier.wait(q_empty.index(buffer), ((local // Q_BUFFERS) & 1) ^ 1)
        write_slot(item_slots, _item_slot(buffer, EARLY_COORDS), num_items)
        mbarrier.arrive(q_ready.index(buffer), count=1)
    else:
        for item in range(gl.program_id(0), num_items, gl.num_programs(0)):
            ring += _load_item(item, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                               v_ready, k_empty, v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q,
                               group_size, seqlen_q, seqlen_k, ring, local, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES,
                               CAUSAL, CONSUMERS, Q_BUFFERS, item_slots if EARLY_COORDS else None, EARLY_KV,
                               EARLY_COORDS)
            local += 1


@gluon.jit
def _consume_item(part: gl.constexpr, item, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                  v_empty, o_desc, LSE, stride_lb, stride_lh, num_items, num_m_blocks, heads_per_group, num_heads_q,
                  group_size, seqlen_q, seqlen_k, qk_scale, ring, local, HEAD_DIM: gl.constexpr,
                  PART_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, CONSUMERS: gl.constexpr, Q_BUFFERS: gl.constexpr,
                  Trace, item_slots=None, EARLY_COORDS: gl.constexpr = False, Q_WAITED: gl.constexpr = False):
    """_persistent_consumer's work on item ``item``, its ``local``-th, as _consumer runs a
    program's rows; the item's Q buffer released once its output, staged there, has been stored.
    Returns how many K/V tiles the item had.

    EARLY_COORDS: the item's batch, head, first row and K/V tiles read from its Q buffer's slots of
    ``item_slots`` once its Q is ready (Q_WAITED: the caller, the dynamic scheduler's consumer, has
    waited for it already), where otherwise q_tile_of_program works them out here: its integer
    divisions by runtime values (the grid's groups, B·Hq rows, heads, GQA groups) sat between one
    item's output and the next item's first S (session 29's timeline: ~610 clocks of each item's
    step to the next, with the Q buffer's release). The loader works them out for its copies anyway,
    off the consumers' path."""
    # (Each branch in its own order: the one without EARLY_COORDS is the shipped kernel's, whose SASS
    # moves if its buffer and trace come before its coordinates.)
    if EARLY_COORDS:
        buffer = local % Q_BUFFERS
        traced = (gl.program_id(0) < TRACE_PROGRAMS) & (local < TRACE_ITEMS)
        item_trace = None
        if Trace is not None:
            item_trace = Trace + ((gl.program_id(0) * TRACE_ITEMS + local) * CONSUMERS + part) * TRACE_EVENTS
        _stamp(item_trace, 0, traced)
        if not Q_WAITED:
            mbarrier.wait(q_ready.index(buffer), (local // Q_BUFFERS) & 1)
        _stamp(item_trace, 1, traced)
        batch, head, q_start, n_tiles = _read_coords(item_slots, buffer)
        LSE_head = LSE + batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
    else:
        batch, head, head_kv, q_start, kv_end = q_tile_of_program(item, num_m_blocks, heads_per_group, num_heads_q,
                                                                  group_size, seqlen_q, seqlen_k, BLOCK_M, CAUSAL,
                                                                  num_items, PART_M)
        n_tiles = gl.maximum(gl.cdiv(kv_end, BLOCK_N), 1)
        LSE_head = LSE + batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
        buffer = local % Q_BUFFERS
        traced = (gl.program_id(0) < TRACE_PROGRAMS) & (local < TRACE_ITEMS)
        item_trace = None
        if Trace is not None:
            item_trace = Trace + ((gl.program_id(0) * TRACE_ITEMS + local) * CONSUMERS + part) * TRACE_EVENTS
    _consumer(part, q_smem, k_smem, v_smem, q_ready.index(buffer), k_ready, v_ready, k_empty, v_empty, o_desc,
              LSE_head, batch, head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale, None, 0, None, HEAD_DIM,
              PART_M, BLOCK_N, NUM_STAGES, CAUSAL, None, OVERLAP, buffer * CONSUMERS + part,
              (local // Q_BUFFERS) & 1, ring, item_trace, traced, EARLY_COORDS)
    mbarrier.arrive(q_empty.index(buffer), count=1)  # _consumer waited for its output's store
    return n_tiles


@gluon.jit
def _persistent_consumer(part: gl.constexpr, shared, HEAD_DIM: gl.constexpr, PART_M: gl.constexpr,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                         CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, CONSUMERS: gl.constexpr,
                         Q_BUFFERS: gl.constexpr, TileCounter, item_slots, Trace, EARLY_COORDS: gl.constexpr = False):
    """_consumer for a persistent program: the same work items as _persistent_loader's (under the
    dynamic scheduler, read from ``item_slots`` once the item's Q buffer is ready; EARLY_COORDS:
    their coordinates too, in fixed turns as well: _consume_item). ``shared``: what every consumer
    partition takes alike (the kernel's ``consumer_shared``), as one tuple, so that each partition's
    entry in warp_specialize names only its part."""
    q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, stride_lb, \
        stride_lh, num_items, num_m_blocks, heads_per_group, num_heads_q, group_size, seqlen_q, seqlen_k, \
        qk_scale = shared
    ring = 0
    local = 0
    if TileCounter is not None:
        mbarrier.wait(q_ready.index(0), 0)
        item = read_slot(item_slots, 0)
        while item < num_items:
            ring += _consume_item(part, item, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                  v_empty, o_desc, LSE, stride_lb, stride_lh, num_items, num_m_blocks,
                                  heads_per_group, num_heads_q, group_size, seqlen_q, seqlen_k, qk_scale, ring, local,
                                  HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP, CONSUMERS,
                                  Q_BUFFERS, Trace, item_slots, EARLY_COORDS, True)
            local += 1
            buffer = local % Q_BUFFERS
            mbarrier.wait(q_ready.index(buffer), (local // Q_BUFFERS) & 1)
            item = read_slot(item_slots, _item_slot(buffer, EARLY_COORDS))
    else:
        for item in range(gl.program_id(0), num_items, gl.num_programs(0)):
            ring += _consume_item(part, item, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                  v_empty, o_desc, LSE, stride_lb, stride_lh, num_items, num_m_blocks,
                                  heads_per_group, num_heads_q, group_size, seqlen_q, seqlen_k, qk_scale, ring, local,
                                  HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP, CONSUMERS,
                                  Q_BUFFERS, Trace, item_slots, EARLY_COORDS)
            local += 1


@gluon.jit
def _persistent_barriers(Q_BUFFERS: gl.constexpr, CONSUMERS: gl.constexpr):
    """(q_ready, q_empty) of a persistent forward: per Q buffer, the TMA unit arrives on its
    "ready" barrier and each consumer warpgroup on its "empty" one."""
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(Q_BUFFERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=CONSUMERS)
    return q_ready, q_empty


@gluon.jit
def _pipeline_buffers(q_desc, k_desc, v_desc, PART_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                      NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The Q tile's CONSUMERS parts, the K/V ring and their mbarriers, allocated and initialised:
    (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty)."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, 1, 1, PART_M, HEAD_DIM], q_desc.layout)
    k_smem, v_smem = kv_ring_buffers(k_desc, v_desc, BLOCK_N, HEAD_DIM, NUM_STAGES)
    q_ready, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(NUM_STAGES, CONSUMERS)
    fence_async_shared()  # the inits visible to the TMA unit before its first copy
    return q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def _fwd_pingpong_kernel(
    q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh,
    num_heads_q, group_size, seqlen_q, seqlen_k, num_m_blocks, heads_per_group, qk_scale, TileCounter,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
    CONSUMERS: gl.constexpr = 2, OVERLAP: gl.constexpr = True, PERSISTENT: gl.constexpr = False,
    Q_BUFFERS: gl.constexpr = 1, EARLY_KV: gl.constexpr = False, Trace=None, EARLY_COORDS: gl.constexpr = False,
):
    """O (B, Hq, Sq, D) and LSE (B, Hq, Sq) of one BLOCK_M-row Q tile of one head.

    Launch with num_warps=4 (the default partition is the first consumer) on a 1-D grid of
    num_m_blocks × B × Hq programs, Q tiles fastest (under CAUSAL in groups of heads_per_group heads,
    heads fastest within a group: q_tile_of_program). Descriptors: q_desc and o_desc over
    (B, Hq, Sq, D) with a (1, 1, BLOCK_M / CONSUMERS, D) block, k_desc and v_desc over
    (B, Hkv, Sk, D) with (1, 1, BLOCK_N, D). CONSUMERS: 2 warpgroups of BLOCK_M / 2 rows, or 3
    (FlashAttention-3's d64 forward: 192-row tiles, more work in flight per K/V tile; the CTA
    padded to 16 warps, the workers' CONSUMER_REGS and the default partition's share of the 64K
    register file: 160 and 168), or 4 (256-row tiles of 64-key tiles; 20 warps, 112 and 120).
    OVERLAP: each consumer's products in FlashAttention-3's order (True) or one tile's after the
    other (False; see _consumer).

    PERSISTENT: a grid of fewer programs (one per SM), each taking the work items (Q tiles, in
    the order above) pid, pid + programs, ... (with TileCounter, a zeroed int32 counter: the
    next item of the grid's counter, handed from the loader to the consumers through a
    shared-memory slot per Q buffer, as FlashAttention-3's dynamic scheduler takes it). The
    CTA's start is paid once per program instead of once per tile, and with Q_BUFFERS = 2 the
    next item's Q and first K/V tiles load while this one's last tiles and output run; with one
    buffer the loader waits for this item's output before the next item's Q, and with EARLY_KV
    copies that item's first K/V tiles before the wait (_persistent_loader). EARLY_COORDS: the
    loader writes each item's coordinates beside its Q (COORD_SLOTS int32 slots per Q buffer) for
    the consumers, which otherwise work them out between one item's output and the next one's
    first product (_consume_item).

    Trace (persistent programs; a probe's): int64 (TRACE_PROGRAMS, TRACE_ITEMS, CONSUMERS,
    TRACE_EVENTS), zeroed, where the consumers stamp their timeline (TRACE_EVENTS); None: nothing.
    """
    gl.static_assert(num_warps == 4)
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3 or CONSUMERS == 4)
    PART_M: gl.constexpr = BLOCK_M // CONSUMERS
    gl.static_assert(PART_M * CONSUMERS == BLOCK_M)
    if PERSISTENT:
        num_items = num_m_blocks * q_desc.shape[0] * num_heads_q
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_BUFFERS * CONSUMERS, 1, 1, PART_M, HEAD_DIM],
                                           q_desc.layout)
        k_smem, v_smem = kv_ring_buffers(k_desc, v_desc, BLOCK_N, HEAD_DIM, NUM_STAGES)
        _, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(NUM_STAGES, CONSUMERS)
        q_ready, q_empty = _persistent_barriers(Q_BUFFERS, CONSUMERS)
        # The dynamic scheduler's item of each Q buffer (unused, and left out of the build, without
        # TileCounter or EARLY_COORDS: a None made here would not pass to the partitions as a
        # constant); under EARLY_COORDS the item's coordinates too, COORD_SLOTS slots a buffer.
        ITEM_SLOTS: gl.constexpr = COORD_SLOTS if EARLY_COORDS else 1
        item_slots = gl.allocate_shared_memory(gl.int32, [Q_BUFFERS * ITEM_SLOTS, 1],
                                               gl.SwizzledSharedLayout(1, 1, 1, [0]))
        fence_async_shared()  # the inits visible to the TMA unit before its first copy
        # What every consumer partition takes alike, as one tuple, so that each partition's entry names
        # its part and the constexprs only. (warp_specialize passes tensors and scalars inside a tuple
        # but not Python ints or None, so the optional counter stays beside it; and each entry must be
        # written as a (function, arguments) pair in the list: one kept in a variable does not build.)
        consumer_shared = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, o_desc, LSE,
                           stride_lb, stride_lh, num_items, num_m_blocks, heads_per_group, num_heads_q, group_size,
                           seqlen_q, seqlen_k, qk_scale)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_persistent_consumer, (0, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_consumer, (1, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                      v_ready, k_empty, v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q,
                                      group_size, seqlen_q, seqlen_k, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                      CONSUMERS, Q_BUFFERS, TileCounter, item_slots, EARLY_KV, EARLY_COORDS)),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        elif CONSUMERS == 3:
            gl.warp_specialize([
                (_persistent_consumer, (0, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_consumer, (1, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_consumer, (2, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                      v_ready, k_empty, v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q,
                                      group_size, seqlen_q, seqlen_k, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                      CONSUMERS, Q_BUFFERS, TileCounter, item_slots, EARLY_KV, EARLY_COORDS)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([
                (_persistent_consumer, (0, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_consumer, (1, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_consumer, (2, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_consumer, (3, consumer_shared, HEAD_DIM, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                        OVERLAP, CONSUMERS, Q_BUFFERS, TileCounter, item_slots, Trace,
                                        EARLY_COORDS)),
                (_persistent_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                      v_ready, k_empty, v_empty, num_items, num_m_blocks, heads_per_group, num_heads_q,
                                      group_size, seqlen_q, seqlen_k, PART_M, BLOCK_M, BLOCK_N, NUM_STAGES, CAUSAL,
                                      CONSUMERS, Q_BUFFERS, TileCounter, item_slots, EARLY_KV, EARLY_COORDS)),
            ], [4, 4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    else:
        _one_tile_per_program(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh, num_heads_q, group_size,
                              seqlen_q, seqlen_k, num_m_blocks, heads_per_group, qk_scale, HEAD_DIM, PART_M, BLOCK_M,
                              BLOCK_N, NUM_STAGES, CAUSAL, LOADER_REGS, CONSUMER_REGS, CONSUMERS, OVERLAP)


@gluon.jit
def _one_tile_per_program(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh, num_heads_q, group_size, seqlen_q,
                          seqlen_k, num_m_blocks, heads_per_group, qk_scale, HEAD_DIM: gl.constexpr,
                          PART_M: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, LOADER_REGS: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, CONSUMERS: gl.constexpr, OVERLAP: gl.constexpr):
    """_fwd_pingpong_kernel's body when each program runs one Q tile (not PERSISTENT)."""
    batch, head, head_kv, q_start, kv_end = q_tile_of_program(gl.program_id(0), num_m_blocks, heads_per_group,
                                                              num_heads_q, group_size, seqlen_q, seqlen_k,
                                                              BLOCK_M, CAUSAL, LEAD_PART=PART_M)
    # At least one tile: rows that see no key at all still run (masked) and write O = 0,
    # LSE = -inf; the host never launches with seqlen_k = 0.
    n_tiles = gl.maximum(gl.cdiv(kv_end, BLOCK_N), 1)
    LSE_head = LSE + batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
    q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty = _pipeline_buffers(
        q_desc, k_desc, v_desc, PART_M, HEAD_DIM, BLOCK_N, NUM_STAGES, CONSUMERS)

    # What every consumer partition takes alike, as one tuple (see _fwd_pingpong_kernel's persistent
    # branch); a partition's entry adds its part and the constexprs.
    consumer_shared = (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, o_desc, LSE_head, batch,
                       head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_tile_consumer, (0, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_tile_consumer, (1, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty,
                       batch, head, head_kv, q_start, n_tiles, None, PART_M, BLOCK_N, NUM_STAGES, CONSUMERS)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif CONSUMERS == 3:
        gl.warp_specialize([
            (_tile_consumer, (0, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_tile_consumer, (1, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_tile_consumer, (2, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty,
                       batch, head, head_kv, q_start, n_tiles, None, PART_M, BLOCK_N, NUM_STAGES, CONSUMERS)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_tile_consumer, (0, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_tile_consumer, (1, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_tile_consumer, (2, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_tile_consumer, (3, consumer_shared, HEAD_DIM, PART_M, BLOCK_N, NUM_STAGES, CAUSAL, OVERLAP)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty,
                       batch, head, head_kv, q_start, n_tiles, None, PART_M, BLOCK_N, NUM_STAGES, CONSUMERS)),
        ], [4, 4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


@gluon.jit
def _fwd_listed_kernel(
    q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh,
    KvIdx, KvPartial, KvCount, KvOrder, MaskBuf, stride_ib, stride_ih, stride_im, stride_cb, stride_ch,
    num_heads_q, group_size, seqlen_q, seqlen_k, num_m_blocks, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    MASK_MOD: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """The forward of _fwd_pingpong_kernel over a block mask's tile lists (block_mask.py):
    each Q tile visits only its listed K/V tiles, the partial ones (listed first) masked by
    MASK_MOD evaluated in the kernel, the full ones not masked at all.

    Lists: KvIdx (B', H', num_m_blocks, num_n) int32 tile numbers, KvPartial and KvCount
    (B', H', num_m_blocks) int32, KvOrder (B', H', num_m_blocks) int32, the Q tiles most
    visited first; B' and H' are 1 (strides 0) when the mask ignores b or h. MaskBuf: the
    int32 tensor the mask reads (any int32 pointer when it reads none). BLOCK_M and BLOCK_N
    are the block mask's tiles. Grid and descriptors as _fwd_pingpong_kernel's.
    """
    gl.static_assert(num_warps == 4)
    PART_M: gl.constexpr = BLOCK_M // 2
    batch, head, block_m, n_partial, n_visited, tiles = listed_q_tile_of_program(
        gl.program_id(0), num_m_blocks, num_heads_q, KvIdx, KvPartial, KvCount, KvOrder, stride_ib, stride_ih,
        stride_im, stride_cb, stride_ch)
    # A Q tile that sees no key still runs one step, over the first tile of its list (every
    # tile is empty for it) with the mask evaluated: every score hidden, so O = 0, LSE = -inf.
    n_tiles = gl.maximum(n_visited, 1)
    n_masked = n_partial
    if n_visited == 0:
        n_masked = 1
    q_start = block_m * BLOCK_M
    LSE_head = LSE + batch.to(gl.int64) * stride_lb + head.to(gl.int64) * stride_lh
    q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty = _pipeline_buffers(
        q_desc, k_desc, v_desc, PART_M, HEAD_DIM, BLOCK_N, NUM_STAGES, 2)

    gl.warp_specialize([
        (_consumer, (0, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, o_desc, LSE_head, batch,
                     head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale, tiles, n_masked, MaskBuf, HEAD_DIM, PART_M,
                     BLOCK_N, NUM_STAGES, False, MASK_MOD, True, 0, 0, 0)),
        (_consumer, (1, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, o_desc, LSE_head, batch,
                     head, q_start, seqlen_q, seqlen_k, n_tiles, qk_scale, tiles, n_masked, MaskBuf, HEAD_DIM, PART_M,
                     BLOCK_N, NUM_STAGES, False, MASK_MOD, True, 1, 0, 0)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, batch,
                   head, head // group_size, q_start, n_tiles, tiles, PART_M, BLOCK_N, NUM_STAGES, 2)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
