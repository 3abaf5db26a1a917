"""What the Gluon kernels (gluon_fwd.py, gluon_bwd.py, gluon_bwd_wide.py, gluon_bwd_fused.py)
share: TMA copy names and the partition barrier across Triton versions, the register layout of a
wgmma accumulator, the Q or key tile a program owns, the loaders' rings (K/V tiles for the
forward and dQ, Q-side tiles for dK/dV), and the masking of a Q-row tile's scores (dense or a
block mask's list)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

# Triton 3.7 renamed the TMA copies (3.6: async_copy_global_to_shared / _shared_to_global);
# the old names still exist in 3.9 but fail when compiled.
if hasattr(tma, "async_load"):
    tma_load = tma.async_load
    tma_store = tma.async_store
else:
    tma_load = tma.async_copy_global_to_shared
    tma_store = tma.async_copy_shared_to_global

# Triton 3.6 calls the barrier of a partition's threads thread_barrier, 3.9 barrier.
partition_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

# A shared-memory buffer seen as another dtype, shape and layout (the same bytes): 3.6 has it as
# the descriptor's _reinterpret, 3.9 as reinterpret; called as reinterpret_shared(buffer, dtype,
# shape, layout).
_descriptor_type = gl.shared_memory_descriptor
reinterpret_shared = getattr(_descriptor_type, "reinterpret", None) or _descriptor_type._reinterpret

# TMA bulk reductions into global memory (cp.reduce.async.bulk.tensor): Gluon has them from
# Triton 3.8 on; gluon_bwd_fused.py adds dQ with them (tma_reduce_add).
HAS_TMA_REDUCE = hasattr(tma, "async_atomic_add")
# (Gluon's reduction, or a stand-in that BY_PTX never reaches: Triton reads every name a kernel
# uses when it first builds it, the untaken branch's too.)
_tma_atomic_add = tma.async_atomic_add if HAS_TMA_REDUCE else tma_store


@gluon.jit
def write_slot(slots, index, value):
    """The int32 ``value`` into slot ``index`` of ``slots`` ([n, 1] int32 shared memory), from
    every thread of the partition (the same value)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    slots.index(index).store(gl.full([1], value, gl.int32, layout=layout))


@gluon.jit
def read_slot(slots, index):
    """Slot ``index`` of ``slots`` ([n, 1] int32 shared memory), a scalar in every thread."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.max(slots.index(index).load(layout), axis=0)


@gluon.jit
def tma_reduce_add(desc, coords, smem, BY_PTX: gl.constexpr):
    """Add the shared-memory box ``smem`` into ``desc``'s tensor at ``coords`` with a TMA bulk
    reduction. ``BY_PTX`` (a Triton whose Gluon lacks the reduction): issue a TMA store of the
    box, which tma_reduce_ptx.py's compile stage rewrites into the reduction."""
    if BY_PTX:
        tma_store(desc, coords, smem)
    else:
        _tma_atomic_add(desc, coords, smem)


@gluon.constexpr_function
def accumulator_layout(num_warps, columns):
    """wgmma's register layout of an (M, columns) float32 accumulator: 16-bit inputs take
    instructions of 16 rows x columns x 16; the warps stack along M."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, columns, 16])


@gluon.jit
def stream_kv_tiles(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, head_kv, n_tiles,
                    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, tiles=None, first=0, start=0):
    """The loader's loop of the forward and dQ kernels: K and V tile j of (batch, head_kv)
    into ring slot (first + j) % NUM_STAGES, each once the consumers have released the slot's
    previous tile (its "empty" barrier) and signalled on its "ready" barrier. With ``tiles``
    (a pointer to a block mask's list of K/V tile numbers), step j copies tile tiles[j].
    ``first``: the tiles that went round the ring before these (a persistent program's earlier
    work items). ``start``: the step to begin at (the steps before it copied by an earlier call)."""
    for j in range(start, n_tiles):
        if tiles is None:
            key_start = j * BLOCK_N
        else:
            key_start = gl.load(tiles + j) * BLOCK_N
        slot = (first + j) % NUM_STAGES
        # A new mbarrier counts as having completed the phase before 0, so the first lap
        # round the ring passes the "empty" waits at once.
        free_phase = (((first + j) // NUM_STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), free_phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma_load(k_desc, [batch, head_kv, key_start, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), free_phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma_load(v_desc, [batch, head_kv, key_start, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def hide_scores(s, rows, j, seqlen_q, seqlen_k, shift, diagonal, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr, tiles, n_masked, batch, head, mask_buffer, MASK_MOD: gl.constexpr):
    """Step j's scores s (rows × BLOCK_N) with the scores its rows do not see at -inf: the
    forward's and the dQ kernels' masking (s raw or already scaled and shifted: -inf either way).

    Dense (MASK_MOD None): key tile j; query row r sees keys up to r + ``shift``
    (seqlen_k - seqlen_q: bottom-right aligned) under CAUSAL, ``diagonal`` being that bound
    for the warpgroup's first row. Listed: key tile tiles[j] of a block mask's list, whose
    first ``n_masked`` tiles evaluate MASK_MOD(batch, head, q_idx, kv_idx, mask_buffer) and
    whose other (full) tiles are visible everywhere.
    """
    cols_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    if MASK_MOD is None:
        # Only tiles that cross the end of the keys or the causal diagonal are masked: a
        # branch uniform across the warpgroup keeps the index math out of the other tiles.
        tile_start = j * BLOCK_N
        crosses_end = tile_start + BLOCK_N > seqlen_k
        if CAUSAL:
            crosses = crosses_end | (tile_start + BLOCK_N - 1 > diagonal)
        else:
            crosses = crosses_end
        if crosses:
            cols = tile_start + gl.arange(0, BLOCK_N, layout=cols_layout)
            visible = (cols < seqlen_k)[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= (rows + shift)[:, None])
            s = gl.where(visible, s, -float("inf"))
    elif j < n_masked:
        cols = gl.load(tiles + j) * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_layout)
        # Indices clamped into range, as in fwd.py: a mask may index a tensor with them. Rows
        # past the queries are never stored; columns past the keys are hidden here.
        visible = MASK_MOD(batch, head, gl.minimum(rows, seqlen_q - 1)[:, None],
                           gl.minimum(cols, seqlen_k - 1)[None, :], mask_buffer)
        s = gl.where(visible & (cols < seqlen_k)[None, :], s, -float("inf"))
    return s


@gluon.jit
def tile_and_row_of_program(pid, num_tiles, heads_per_group, num_programs=None):
    """(rank, bh) of program ``pid`` in a grid of num_tiles tiles for each of its B·H rows (a
    grid of ``num_programs`` work items, by default the launch's own programs: a persistent
    kernel's programs each take several): the
    rows go in groups of ``heads_per_group``, and within a group the tiles' ranks are slowest,
    so that every row's rank-0 tile starts before any row of the group starts its rank-1 tile.

    Under a causal mask a row's tiles carry work falling with their rank (the kernels make rank
    0 the heaviest), and the hardware starts programs about in order: with rows one after the
    other (heads_per_group = 1) the last row's heaviest tile starts late and ends the grid
    alone, where the heaviest tiles of a group first leave only light ones for the end. A group
    is kept small enough that its K/V (or Q/dO) stay in L2 (hopper.causal_heads_per_group).
    heads_per_group = 1 is the plain order, rows slowest, tiles fastest."""
    programs_per_group = heads_per_group * num_tiles
    group = pid // programs_per_group
    first_row = group * heads_per_group
    in_group = pid - group * programs_per_group
    if num_programs is None:
        num_programs = gl.num_programs(0)
    rows_in_group = gl.minimum(heads_per_group, num_programs // num_tiles - first_row)
    return in_group // rows_in_group, first_row + in_group % rows_in_group


@gluon.jit
def q_tile_of_program(pid, num_m_blocks, heads_per_group, heads_q, group_size, seqlen_q, seqlen_k,
                      BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, num_programs=None, LEAD_PART: gl.constexpr = 0):
    """(batch, head, head_kv, q_start, kv_end) of program ``pid`` of the forward or the dQ
    kernel: Q tiles fastest in the grid (with ``heads_per_group`` > 1, groups of that many
    B·Hq rows, rows fastest within a group: tile_and_row_of_program), and under CAUSAL the last
    tiles of a head (which see the most keys) started first; kv_end is where the keys its rows
    see end (bottom-right aligned causal: up to the tile's last row's diagonal).

    LEAD_PART (under CAUSAL; 0: off): the rows by which the head's tiles overhang its end, in
    whole parts of LEAD_PART rows, are moved to the front, so that q_start of the first tile is
    negative and its first parts hold no row. Those parts then sit in the tile that sees the
    fewest keys, where at the end they would idle their warpgroup through the tile that sees
    the most (a d64 forward's 192-row tiles over 4096 rows: two of the last tile's three 64-row
    parts for all 32 key tiles). What is left of the overhang (under a part) stays at the end."""
    block_m, bh = tile_and_row_of_program(pid, num_m_blocks, heads_per_group, num_programs)
    batch = bh // heads_q
    head = bh % heads_q
    if CAUSAL:
        block_m = num_m_blocks - 1 - block_m
    q_start = block_m * BLOCK_M
    if CAUSAL and LEAD_PART > 0:
        q_start -= (num_m_blocks * BLOCK_M - seqlen_q) // LEAD_PART * LEAD_PART
    if CAUSAL:
        kv_end = gl.minimum(seqlen_k, gl.maximum(q_start + BLOCK_M + seqlen_k - seqlen_q, 0))
    else:
        kv_end = seqlen_k
    return batch, head, head // group_size, q_start, kv_end


@gluon.jit
def listed_q_tile_of_program(pid, num_m_blocks, heads_q, KvIdx, KvPartial, KvCount, KvOrder, stride_ib, stride_ih,
                             stride_im, stride_cb, stride_ch):
    """(batch, head, block_m, n_partial, n_visited, tiles) of program ``pid`` of a block-sparse
    forward or dQ kernel: the Q tile ``block_m`` that the block mask's schedule (KvOrder, the most
    visited Q tiles first, so that the grid does not end on them alone) gives the program's slot,
    its counts of partial and of visited K/V tiles, and ``tiles``, its list of K/V tile numbers
    (partial ones first). The lists' layout is block_mask.py's; strides are 0 along a dim the
    mask ignores."""
    bh = pid // num_m_blocks
    batch = bh // heads_q
    head = bh % heads_q
    lists = batch * stride_cb + head * stride_ch
    block_m = gl.load(KvOrder + lists + pid % num_m_blocks)
    n_partial = gl.load(KvPartial + lists + block_m)
    n_visited = gl.load(KvCount + lists + block_m)
    tiles = KvIdx + batch.to(gl.int64) * stride_ib + head.to(gl.int64) * stride_ih + block_m * stride_im
    return batch, head, block_m, n_partial, n_visited, tiles


@gluon.jit
def key_tile_of_program(pid, num_n_blocks, heads_per_group, heads_kv, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, num_programs=None):
    """(batch, head_kv, n_start, first_tile, n_q_tiles, n_q_blocks) of program ``pid`` of a
    dK/dV kernel: key tiles fastest in the grid (with ``heads_per_group`` > 1, groups of that
    many B·Hkv rows, rows fastest within a group: tile_and_row_of_program; under CAUSAL the
    first key tiles, seen from the most Q tiles, start first); the Q tiles of BLOCK_M rows its
    keys are seen from are first_tile.. (n_q_tiles of the head's n_q_blocks; under CAUSAL,
    bottom-right aligned, the first with a row that sees key n_start). ``num_programs``: the
    grid's key tiles where they are not the launch's programs (a persistent kernel's)."""
    block_n, bh = tile_and_row_of_program(pid, num_n_blocks, heads_per_group, num_programs)
    batch = bh // heads_kv
    head_kv = bh % heads_kv
    n_start = block_n * BLOCK_N
    n_q_blocks = gl.cdiv(seqlen_q, BLOCK_M)
    if CAUSAL:
        # first Q tile with a row that sees key n_start: t*BLOCK_M + BLOCK_M - 1 + shift >= n_start
        first_tile = gl.cdiv(gl.maximum(n_start - (seqlen_k - seqlen_q) - (BLOCK_M - 1), 0), BLOCK_M)
        first_tile = gl.minimum(first_tile, n_q_blocks)
    else:
        first_tile = n_start * 0
    return batch, head_kv, n_start, first_tile, n_q_blocks - first_tile, n_q_blocks


@gluon.jit
def q_ring_buffers(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, BLOCK_M: gl.constexpr,
                   KV_ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                   KV_HALVES: gl.constexpr):
    """The dK/dV kernels' tiles in shared memory, allocated in this order: the Q-side ring's Q
    and dO (NUM_STAGES slots of BLOCK_M rows), the CTA's K and V (two halves of KV_ROWS rows
    under KV_HALVES, one per consumer warpgroup, else one tile), the ring's LSE and D rows."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    if KV_HALVES:
        k_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, KV_ROWS, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, KV_ROWS, HEAD_DIM], v_desc.layout)
    else:
        k_smem = gl.allocate_shared_memory(dtype, [1, 1, KV_ROWS, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1, 1, KV_ROWS, HEAD_DIM], v_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, BLOCK_M], delta_desc.layout)
    return q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem


@gluon.jit
def q_ring_barriers(NUM_STAGES: gl.constexpr):
    """The Q-side ring's barriers (q_ready, do_ready, empty), NUM_STAGES of each, allocated;
    init_q_ring_barriers initialises them."""
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    return q_ready, do_ready, empty


@gluon.jit
def init_q_ring_barriers(q_ready, do_ready, empty, NUM_STAGES: gl.constexpr):
    """A slot's Q and dO land on their own barriers (the TMA unit arrives); it is empty once
    both consumer warpgroups have arrived."""
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)


@gluon.jit
def load_q_side_tile(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                     slot, batch, head, row, m_start):
    """Into ring slot ``slot`` of the dK/dV kernels: (Q, lse2) of rows m_start.. of (batch,
    head) on q_ready, (dO, Delta) on do_ready; ``row`` is the head's row of the stats buffers."""
    mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
    tma_load(q_desc, [batch, head, m_start, 0], q_ready.index(slot), q_smem.index(slot))
    tma_load(lse_desc, [row, m_start], q_ready.index(slot), lse_smem.index(slot))
    mbarrier.expect(do_ready.index(slot), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
    tma_load(do_desc, [batch, head, m_start, 0], do_ready.index(slot), do_smem.index(slot))
    tma_load(delta_desc, [row, m_start], do_ready.index(slot), delta_smem.index(slot))


@gluon.jit
def kv_ring_buffers(k_desc, v_desc, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The forward's and dQ kernels' ring of NUM_STAGES K and V tiles of BLOCK_N rows."""
    dtype: gl.constexpr = k_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    return k_smem, v_smem


@gluon.jit
def kv_ring_barriers(NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """(q_ready, k_ready, v_ready, k_empty, v_empty) of the forward and dQ kernels, allocated and
    initialised: the CTA's Q-side tiles land on q_ready, each ring slot's K and V on their own
    "ready" barriers (the TMA unit arrives), and a slot is empty once all CONSUMERS consumer
    warpgroups have arrived."""
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)  # one arrival per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return q_ready, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def q_tile_start(t, first_tile, n_q_tiles, BLOCK_M: gl.constexpr, DESCENDING: gl.constexpr):
    """First row of the ``t``-th Q tile a dK/dV program visits of a head (0 <= t < n_q_tiles):
    first_tile + t, or with DESCENDING the last tile first. Under a causal mask the programs
    that run at once start on different first tiles; visited last first, the ones that started
    together walk the same Q tiles in step (as non-causal ones do) and share their Q, dO and
    (in the five-product kernel) dQ-sum tiles, rather than spreading over a window of tiles as
    wide as the grid's running programs (hopper.FUSED_Q_DESCENDING says where it was faster)."""
    if DESCENDING:
        return (first_tile + n_q_tiles - 1 - t) * BLOCK_M
    return (first_tile + t) * BLOCK_M


@gluon.jit
def stream_q_tiles(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready, do_ready,
                   empty, batch, head_kv, heads_q, group_size, first_tile, n_q_tiles, n_q_blocks,
                   BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, DESCENDING: gl.constexpr = False,
                   step_begin=0, n_steps=None, ring=0):
    """The loader's loop of the dK/dV kernels: (Q, lse2) and (dO, Delta) of Q tiles
    first_tile.. of every query head of kv head ``head_kv``'s group (with DESCENDING the last
    tile first: q_tile_start), tile ``it`` into ring slot it % NUM_STAGES once the consumers
    have released the slot (its "empty" barrier). With ``n_steps``, only steps step_begin..
    +n_steps of that sequence (a program that runs part of a key tile's Q tiles: gluon_bwd_fused's
    tail split, or a persistent program's key tile in two pieces), the ring counted from the
    first of them, after the ``ring`` tiles that went round it before (a persistent program's
    earlier key tiles)."""
    # Counters carried through the loop instead of divisions: slot/phase of the ring, the
    # Q tile within the head (m_start) and the head of the group (row of the stats buffers).
    slot = ring % NUM_STAGES
    phase = (ring // NUM_STAGES) & 1
    step: gl.constexpr = -BLOCK_M if DESCENDING else BLOCK_M
    m_first = (n_q_blocks - 1) * BLOCK_M if DESCENDING else first_tile * BLOCK_M
    m_past = (first_tile - 1) * BLOCK_M if DESCENDING else n_q_blocks * BLOCK_M
    if n_steps is None:
        count = group_size * n_q_tiles
        m_start = m_first
        head = head_kv * group_size
    else:
        count = n_steps
        per_head = gl.maximum(n_q_tiles, 1)  # (no step runs when it is 0)
        head = head_kv * group_size + step_begin // per_head
        m_start = q_tile_start(step_begin % per_head, first_tile, n_q_tiles, BLOCK_M, DESCENDING)
    for it in range(count):
        # a fresh mbarrier has completed the phase "before 0": the first lap passes at once
        mbarrier.wait(empty.index(slot), phase ^ 1)
        load_q_side_tile(q_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, lse_smem, delta_smem, q_ready,
                         do_ready, slot, batch, head, batch * heads_q + head, m_start)
        m_start += step
        if m_start == m_past:
            m_start = m_first
            head += 1
        slot += 1
        if slot == NUM_STAGES:
            slot = 0
            phase ^= 1
