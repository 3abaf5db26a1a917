"""Block masks: which K/V tiles each Q tile visits, so cost follows the visible tiles.

For a mask and tile sizes (BLOCK_M × BLOCK_N), every (Q tile, K/V tile) pair is
*empty* (skipped), *full* (visible everywhere: no mask evaluated) or *partial* (the
mask is evaluated per element). Built on the mask's device by evaluating the mask
one row of tiles at a time (never the whole N×N matrix), or in closed form for a band
(``MaskMod.band``: causal, sliding-window and flashtile's windows), cached per (mask,
shape), and reused across layers and calls. Tiles that hang past the end of the queries or
keys are never full.

Layout (B and H are 1 when the mask does not depend on them)::

    kv_indices    (B, H, num_q_tiles, num_kv_tiles) int32: partial tiles first, then full
    kv_partial    (B, H, num_q_tiles) int32: how many of them are partial
    kv_count      (B, H, num_q_tiles) int32: how many are visited in all
    kv_order      (B, H, num_q_tiles) int32: the Q tiles, most visited K/V tiles first
    kv_runs       (B, H, num_q_tiles, num_kv_tiles) int32: at each full tile's position in
                  kv_indices, how many tiles from it on are consecutive tile numbers (the
                  rest of its run); 0 at partial and unvisited positions
    dq_indices, dq_partial, dq_count, dq_order, dq_runs: the same for the backward's dQ pass, on its
                  tiling: BLOCK_M queries × BACKWARD_BLOCK_N keys (``backward_blocks``; the
                  forward's lists themselves when BACKWARD_BLOCK_N = BLOCK_N)
    q_indices, q_partial, q_count, q_order, q_runs: per K/V tile, for the dK/dV pass, on the dQ
                  pass's tiling transposed: K/V tiles of BLOCK_M keys, Q tiles of
                  BACKWARD_BLOCK_N queries (``dkdv_blocks``)

The kernels walk a row's full tiles run by run, each run as a range of tiles, as the
built-in kernels walk their band: a loop whose next tile's address comes from the list
waits, on Hopper, for every copy in flight before the next one (sm_90 SASS: DEPBAR 0
against 2), and the mask_mod causal forward ran 1.44× the built-in causal through the
list, 1.02–1.04× as a range (H200, N = 16k, d128; docs/performance.md attempt 19).
Causal, window, document and prefix masks have one run per row (``*_full_range``: the
kernels then skip the loop over runs); sink tokens beside a window have two; the pipeline
drains once per run.

The kernels run their programs in the ``*_order`` order, longest lists first, as the
built-in causal kernels do (their longest rows first): a grid that ends on its longest
programs leaves the GPU idle but for them. A causal mask_mod in ascending order ran 1.19×
the built-in causal forward with the same tiles on the H200 (128 × 128, N = 16k).

The dK/dV kernel holds a K/V tile and streams Q tiles past it; its tuned shape on the
H200 is few Q rows past many K/V rows (64 × 128 at d128), the forward's tiles transposed.
With the forward's tiling it ran 128 × 64, and the masked backward cost 1.68× the
built-in causal one (docs/performance.md, session 3). The backward's key tiles are at
most 64 wide by default: with 128 × 128 tiles, which suit the forward at d128, the dK/dV
pass ran 128 × 128, spilled, and cost 3.01× the built-in backward (session 5).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .mask_mods import MaskMod, mask_mod as as_mask_mod
from .op_names import OpNames, constant_under_compile


@dataclass(frozen=True, eq=False)
class BlockMask:
    mask: MaskMod
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    block_m: int
    block_n: int
    backward_block_n: int
    kv_indices: torch.Tensor
    kv_partial: torch.Tensor
    kv_count: torch.Tensor
    kv_order: torch.Tensor
    kv_runs: torch.Tensor
    dq_indices: torch.Tensor
    dq_partial: torch.Tensor
    dq_count: torch.Tensor
    dq_order: torch.Tensor
    dq_runs: torch.Tensor
    q_indices: torch.Tensor
    q_partial: torch.Tensor
    q_count: torch.Tensor
    q_order: torch.Tensor
    q_runs: torch.Tensor
    # Whether every row's full tiles form one run, per list (kv: forward, dq: dQ pass, q:
    # dK/dV pass): the kernels then walk them as one range without the loop over runs,
    # whose nesting costs the range loop register moves (see _fwd_kernel).
    kv_full_range: bool = False
    dq_full_range: bool = False
    q_full_range: bool = False
    # Whether create_block_mask chose the forward's key tiles (block_n=None): a forward kernel
    # that runs wider tiles may then walk this mask's lists at its own width
    # (with_forward_key_tiles; hopper.forward at d <= 128 on sm_90). A block_n the user gave is kept.
    forward_tiles_free: bool = False

    @property
    def backward_blocks(self) -> tuple[int, int]:
        """(Q rows, K/V rows) per tile of the dQ pass."""
        return self.block_m, self.backward_block_n

    @property
    def dkdv_blocks(self) -> tuple[int, int]:
        """(Q rows, K/V rows) per tile of the dK/dV pass: the dQ pass's tiles transposed."""
        return self.backward_block_n, self.block_m

    def lists(self, kernel: str) -> tuple[tuple, tuple, bool]:
        """One kernel's tile lists as the kernels take them (``kernel``: "fwd", "dq" or "dkdv"):
        (indices, partial counts, counts, schedule, runs); their strides (indices' batch, head
        and Q tile; counts' batch and head), 0 where the mask is shared by every batch entry or
        head (the schedule has the counts' strides, the runs the indices'); and whether every
        row's full tiles are one run."""
        return self._lists_of_each_kernel[kernel]

    @functools.cached_property
    def _lists_of_each_kernel(self) -> dict:
        """lists() of each kernel, worked out once: a training step asks for them three times,
        ~10 µs each on a fast CPU (the stride checks), and a block mask's tensors do not change."""
        return {kernel: self._kernel_lists(kernel) for kernel in ("fwd", "dq", "dkdv")}

    def _kernel_lists(self, kernel: str) -> tuple[tuple, tuple, bool]:
        prefix = {"fwd": "kv", "dq": "dq", "dkdv": "q"}[kernel]
        idx, partial, count, order, runs = (getattr(self, f"{prefix}_{part}")
                                            for part in ("indices", "partial", "count", "order", "runs"))
        shared_b, shared_h = self.batch == 1, self.heads == 1
        strides = (0 if shared_b else idx.stride(0), 0 if shared_h else idx.stride(1), idx.stride(2),
                   0 if shared_b else count.stride(0), 0 if shared_h else count.stride(1))
        assert _same_offsets(runs, idx), "runs are read at the indices' offsets"
        assert _same_offsets(order, count) and _same_offsets(partial, count), \
            "the schedule and partial counts are read at the counts' offsets"
        return (idx, partial, count, order, runs), strides, getattr(self, f"{prefix}_full_range")

    def with_forward_key_tiles(self, block_n: int) -> "BlockMask":
        """This block mask with its forward lists (kv_*) rebuilt on ``block_n``-key tiles, the
        backward's lists shared: built once per width, on the mask's device. Only for a mask
        whose forward tiles were left to the library (``forward_tiles_free``)."""
        if not self.forward_tiles_free:
            raise ValueError("block_mask: its key tiles were given to create_block_mask (block_n); only a block "
                             "mask built with block_n=None has its forward tiles chosen by the kernels")
        if block_n == self.block_n:
            return self
        built = self._forward_variants.get(block_n)
        if built is None:
            kinds = _classify(self.mask, self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.block_m, block_n,
                              self.kv_indices.device)
            kv = _lists(kinds)
            built = dataclasses.replace(
                self, block_n=block_n, kv_indices=kv[0], kv_partial=kv[1], kv_count=kv[2], kv_order=kv[3],
                kv_runs=kv[4], kv_full_range=bool(_one_run_per_row(kv)), forward_tiles_free=False)
            self._forward_variants[block_n] = built
        return built

    @functools.cached_property
    def _forward_variants(self) -> dict:
        """with_forward_key_tiles' block masks, by key tile width."""
        return {}

    def tile_kinds(self, kernel: str, rows: int = 1, cols: int = 1) -> list[list[int]]:
        """Per (Q tile, K/V tile) of ``kernel``'s tiling ("fwd": block_m × block_n; "dq":
        backward_blocks), each tile ``rows`` × ``cols`` of them, over every batch entry and head
        at once: 0 where none visits the tile, 1 where every one sees all of it (no mask to
        evaluate), 2 otherwise. The reference backend's walk: it computes all batch entries and
        heads of a tile together, so it skips or leaves unmasked only what holds for all of them,
        and runs larger tiles than the kernels. Worked out once per tiling, on the host."""
        key = (kernel, rows, cols)
        kinds = self._tile_kinds.get(key)
        if kinds is None:
            fine = self._fine_tile_kinds.get(kernel)
            if fine is None:
                fine = self._fine_tile_kinds[kernel] = _kinds_over_batch_and_heads(*self.lists(kernel)[0][:3])
            kinds = self._tile_kinds[key] = _coarsened(fine, rows, cols).tolist()
        return kinds

    @functools.cached_property
    def _tile_kinds(self) -> dict:
        """tile_kinds' answers, by (kernel, rows, cols) (lists: the reference reads one per tile)."""
        return {}

    @functools.cached_property
    def _fine_tile_kinds(self) -> dict:
        """Each kernel's tile kinds on its own tiling, an int8 tensor on the CPU."""
        return {}

    @property
    def mask_buffer(self) -> torch.Tensor:
        """The int32 tensor the mask reads, or (for a mask that reads none) any int32 tensor of
        this block mask: the Gluon kernels take a pointer either way."""
        return self.mask.buffer if self.mask.buffer is not None else self.kv_count

    @property
    def visited_fraction(self) -> float:
        """Visited tiles over all tiles: what the kernels' cost scales with."""
        tiles = self.kv_indices.shape[-2] * self.kv_indices.shape[-1] * self.batch * self.heads
        return float(self.kv_count.sum()) / tiles


def _kinds_over_batch_and_heads(indices: torch.Tensor, partial: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """BlockMask.tile_kinds (num_q_tiles, num_kv_tiles) int8 on the CPU, from one kernel's lists
    (``_lists``: each row's indices are every tile, partial ones first, then full, then empty)."""
    position = torch.arange(indices.shape[-1], device=indices.device)
    listed = torch.where(position < partial.unsqueeze(-1), 2, torch.where(position < count.unsqueeze(-1), 1, 0))
    kinds = torch.zeros_like(listed).scatter_(-1, indices.long(), listed)  # (B, H, num_q, num_kv): 2 partial, 1 full
    visited = kinds.flatten(0, 1).amax(dim=0) > 0
    full = (kinds == 1).flatten(0, 1).all(dim=0)
    return torch.where(full, 1, torch.where(visited, 2, 0)).to(torch.int8).cpu()


def _coarsened(kinds: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The kinds of tiles ``rows`` × ``cols`` of ``kinds``'s: empty where every one is, full
    where every one is (a tile that reaches past the grid's last row or column is at most
    partial: the part past it was never classified)."""
    if (rows, cols) == (1, 1):
        return kinds
    num_q, num_kv = kinds.shape
    padded = torch.full((-(-num_q // rows) * rows, -(-num_kv // cols) * cols), -1, dtype=kinds.dtype)
    padded[:num_q, :num_kv] = kinds
    tiles = padded.view(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols).transpose(1, 2).flatten(2)
    visited, full = (tiles > 0).any(dim=-1), (tiles == 1).all(dim=-1)
    return torch.where(full, 1, torch.where(visited, 2, 0)).to(torch.int8)


def _same_offsets(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether every element of ``a`` sits at the offset of ``b``'s at the same index: equal
    shapes, and equal strides but along dims of size 1 (never stepped along, and left as they
    came by .contiguous(): a one-tile dim of the transposed lists had stride 4 in one tensor
    and 1 in the other, which an exact comparison refused on the H200)."""
    return a.shape == b.shape and all(n == 1 or sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()))


def _classify(mask: MaskMod, batch, heads, seqlen_q, seqlen_k, block_m, block_n, device):
    """(B, H, num_m, num_n) uint8: 0 empty, 1 partial, 2 full."""
    num_m, num_n = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
    if mask.band is not None:  # the same kinds in closed form, without evaluating the mask
        kinds = _classify_band(*mask.band, seqlen_q, seqlen_k, block_m, block_n, device)
        return kinds.view(1, 1, num_m, num_n).expand(batch, heads, num_m, num_n).contiguous()
    kinds = torch.empty(batch, heads, num_m, num_n, dtype=torch.uint8, device=device)
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    kv = torch.arange(num_n * block_n, device=device).view(1, 1, 1, -1)
    for m in range(num_m):  # one row of tiles at a time: O(BLOCK_M · N) memory
        q = torch.arange(m * block_m, (m + 1) * block_m, device=device).view(1, 1, -1, 1)
        inside = (q < seqlen_q) & (kv < seqlen_k)
        # Out-of-range indices are clamped before the mask reads them (a document mask
        # indexes a tensor); they are masked out right after.
        visible = torch.broadcast_to(mask(b, h, q.clamp(max=seqlen_q - 1), kv.clamp(max=seqlen_k - 1)) & inside,
                                     (batch, heads, block_m, num_n * block_n))
        tiles = visible.view(batch, heads, block_m, num_n, block_n)
        any_visible = tiles.any(dim=4).any(dim=2)
        all_visible = torch.broadcast_to(inside, visible.shape).view(tiles.shape).all(dim=4).all(dim=2) & \
            tiles.all(dim=4).all(dim=2)
        kinds[:, :, m] = torch.where(all_visible, 2, torch.where(any_visible, 1, 0)).to(torch.uint8)
    return kinds


def _classify_band(lower, upper, seqlen_q, seqlen_k, block_m, block_n, device) -> torch.Tensor:
    """(num_m, num_n) uint8 kinds of the band ``lower <= kv - q <= upper`` (None: unbounded),
    as _classify's mask evaluation gives them: a tile's pairs inside the sequences take every
    difference kv - q from its first key less its last row to its last key less its first row,
    so it sees some key when that interval meets the band and all of them when the band holds
    the interval and the tile lies inside both sequences. O(tiles), no per-element work."""
    num_m, num_n = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
    row_lo = torch.arange(num_m, device=device).view(-1, 1) * block_m
    col_lo = torch.arange(num_n, device=device).view(1, -1) * block_n
    row_hi = (row_lo + block_m).clamp(max=seqlen_q) - 1  # last row inside the queries
    col_hi = (col_lo + block_n).clamp(max=seqlen_k) - 1
    least, most = col_lo - row_hi, col_hi - row_lo
    meets = torch.ones(num_m, num_n, dtype=torch.bool, device=device)
    holds = ((row_lo + block_m <= seqlen_q) & (col_lo + block_n <= seqlen_k)).expand(num_m, num_n)
    if lower is not None:
        meets = meets & (most >= lower)
        holds = holds & (least >= lower)
    if upper is not None:
        meets = meets & (least <= upper)
        holds = holds & (most <= upper)
    if lower is not None and upper is not None and lower > upper:  # an empty band meets no interval
        meets = torch.zeros_like(meets)
    return torch.where(holds, 2, torch.where(meets, 1, 0)).to(torch.uint8)


def _lists(kinds: torch.Tensor):
    """Per row: indices of partial tiles then full tiles, their counts, the rows' schedule
    (most visited tiles first; ties in ascending order), and the full tiles' runs."""
    # Sort key: partial (0) before full (1) before empty (2); stable keeps ascending tiles.
    order_key = torch.where(kinds == 1, 0, torch.where(kinds == 2, 1, 2)).to(torch.int16)
    indices = torch.sort(order_key, dim=-1, stable=True).indices.to(torch.int32)
    partial = (kinds == 1).sum(dim=-1, dtype=torch.int32)
    count = partial + (kinds == 2).sum(dim=-1, dtype=torch.int32)
    schedule = torch.sort(count, dim=-1, descending=True, stable=True).indices.to(torch.int32)
    runs = _runs(indices, partial, count)
    return indices.contiguous(), partial.contiguous(), count.contiguous(), schedule.contiguous(), runs.contiguous()


def _one_run_per_row(lists) -> torch.Tensor:
    """Whether every row of ``_lists``'s output has its full tiles in one run (true of causal,
    window, document and prefix masks), as a bool tensor on the lists' device: the caller
    reads the three passes' answers in one host sync."""
    _, partial, count, _, runs = lists
    tiles = runs.shape[-1]
    if tiles == 0:
        return torch.ones((), dtype=torch.bool, device=runs.device)
    first_run = runs.gather(-1, partial.clamp(max=tiles - 1).unsqueeze(-1).long()).squeeze(-1)
    return ((first_run == count - partial) | (count == partial)).all()


def _runs(indices: torch.Tensor, partial: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """At each full tile's position (partial..count of a row of ``_lists``), the number of
    positions from it to the end of its run of consecutive tile numbers; 0 elsewhere. On the
    device, without a host sync: each position finds the first run end at or after it."""
    tiles = indices.shape[-1]
    pos = torch.arange(tiles, device=indices.device, dtype=torch.int32)
    full = (pos >= partial.unsqueeze(-1)) & (pos < count.unsqueeze(-1))
    # A full position continues into the next when that one is full and holds the next tile.
    continues = torch.zeros_like(full)
    continues[..., :-1] = full[..., :-1] & full[..., 1:] & (indices[..., 1:] == indices[..., :-1] + 1)
    run_end = torch.where(full & ~continues, pos, tiles)
    next_end = run_end.flip(-1).cummin(dim=-1).values.flip(-1)
    return torch.where(full, next_end - pos + 1, 0).to(torch.int32)


@functools.lru_cache(maxsize=64)
def _cached(mask, batch, heads, seqlen_q, seqlen_k, block_m, block_n, backward_block_n, device, tiles_free):
    def classify(rows, cols):
        return _classify(mask, batch, heads, seqlen_q, seqlen_k, rows, cols, device)

    kinds = classify(block_m, block_n)
    kv = _lists(kinds)
    # The dQ pass tiles (block_m queries, backward_block_n keys); the dK/dV pass the same
    # transposed (backward_block_n queries, block_m keys; see dkdv_blocks).
    backward = kinds if backward_block_n == block_n else classify(block_m, backward_block_n)
    dq = kv if backward is kinds else _lists(backward)
    transposed = backward if backward_block_n == block_m else classify(backward_block_n, block_m)
    q = _lists(transposed.transpose(2, 3))
    kv_one_run, dq_one_run, q_one_run = torch.stack([_one_run_per_row(lists) for lists in (kv, dq, q)]).tolist()
    return BlockMask(mask, batch, heads, seqlen_q, seqlen_k, block_m, block_n, backward_block_n, *kv, *dq, *q,
                     kv_full_range=kv_one_run, dq_full_range=dq_one_run, q_full_range=q_one_run,
                     forward_tiles_free=tiles_free)


def create_block_mask(mask, batch: int = 1, heads: int = 1, seqlen_q: int = 1, seqlen_k: int = 1, device=None,
                      block_m: int = 128, block_n: int | None = None,
                      backward_block_n: int | None = None) -> BlockMask:
    """Build (or fetch from the cache) the block mask of ``mask`` for one problem shape.

    batch/heads: 1 when the mask ignores b/h (it is then shared by every batch entry and
    head). Pass the result to ``flashtile.attention(..., mask_mod=mask, block_mask=bm)``
    in every layer; it is rebuilt only when the shape or the mask changes.

    block_m × block_n: the forward's tiles (queries × keys). block_n=None (the default)
    leaves the key tiles to the kernels: 64, whose tiles fit the Triton kernels at every head
    dim and dtype, and 128 where the block-sparse Gluon forward runs (sm_90, head dims up to
    128), over lists of the same mask built on first use. backward_block_n: the key tiles of
    the dQ pass, which the dK/dV pass uses as query tiles; default ``min(block_n, 64)``, as
    wider ones spill in the dK/dV kernel.
    """
    mask = as_mask_mod(mask)
    tiles_free = block_n is None
    if tiles_free:
        block_n = 64
    if backward_block_n is None:
        backward_block_n = min(block_n, 64) if isinstance(block_n, int) else block_n
    for name, value in (("batch", batch), ("heads", heads), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k),
                        ("block_m", block_m), ("block_n", block_n), ("backward_block_n", backward_block_n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    for name, value in (("block_m", block_m), ("block_n", block_n), ("backward_block_n", backward_block_n)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name}: expected a power of two >= 16, got {value}")
    device = torch.device(device) if device is not None else (
        mask.buffer.device if mask.buffer is not None else torch.device("cpu"))
    return _cached(mask, batch, heads, seqlen_q, seqlen_k, block_m, block_n, backward_block_n, device, tiles_free)


_names: OpNames[BlockMask] = OpNames("block mask")


@constant_under_compile
def register(block_mask: BlockMask) -> str:
    """A name the custom ops can carry (see :mod:`flashtile.op_names`)."""
    return _names.register(block_mask, "blockmask")


def lookup(key: str) -> BlockMask:
    return _names.lookup(key)


@functools.lru_cache(maxsize=64)
def depends_on_batch_and_head(mask: MaskMod) -> tuple[bool, bool]:
    """Whether the mask's value varies with b or h, probed once per mask on a tiny grid.

    A mask that uses b or h broadcasts its result over their index tensors; one that does
    not keeps size 1 there.
    """
    # Positions 0..3, or only 0 when the mask reads a tensor shorter than that.
    n = 1 if mask.buffer is not None and mask.buffer.numel() < 4 else 4
    device = mask.buffer.device if mask.buffer is not None else None  # the indices must sit beside the buffer
    positions = torch.arange(n, device=device)
    index = torch.arange(2, device=device)
    probe = mask(index.view(-1, 1, 1, 1), index.view(1, -1, 1, 1), positions.view(1, 1, -1, 1),
                 positions.view(1, 1, 1, -1))
    return probe.dim() == 4 and probe.shape[0] > 1, probe.dim() == 4 and probe.shape[1] > 1
