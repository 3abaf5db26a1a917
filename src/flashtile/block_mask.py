"""Block masks: which K/V tiles each Q tile visits, so cost follows the visible tiles.

For a mask and tile sizes (BLOCK_M × BLOCK_N), every (Q tile, K/V tile) pair is
*empty* (skipped), *full* (visible everywhere: no mask evaluated) or *partial* (the
mask is evaluated per element). Built on the mask's device by evaluating the mask
one row of tiles at a time (never the whole N×N matrix), cached per (mask, shape),
and reused across layers and calls. Tiles that hang past the end of the queries or
keys are never full.

Layout (B and H are 1 when the mask does not depend on them)::

    kv_indices    (B, H, num_q_tiles, num_kv_tiles) int32: partial tiles first, then full
    kv_partial    (B, H, num_q_tiles) int32: how many of them are partial
    kv_count      (B, H, num_q_tiles) int32: how many are visited in all
    kv_order      (B, H, num_q_tiles) int32: the Q tiles, most visited K/V tiles first
    dq_indices, dq_partial, dq_count, dq_order: the same for the backward's dQ pass, on its
                  tiling: BLOCK_M queries × BACKWARD_BLOCK_N keys (``backward_blocks``; the
                  forward's lists themselves when BACKWARD_BLOCK_N = BLOCK_N)
    q_indices, q_partial, q_count, q_order: per K/V tile, for the dK/dV pass, on the dQ
                  pass's tiling transposed: K/V tiles of BLOCK_M keys, Q tiles of
                  BACKWARD_BLOCK_N queries (``dkdv_blocks``)

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
    dq_indices: torch.Tensor
    dq_partial: torch.Tensor
    dq_count: torch.Tensor
    dq_order: torch.Tensor
    q_indices: torch.Tensor
    q_partial: torch.Tensor
    q_count: torch.Tensor
    q_order: torch.Tensor
    # Whether every row's full tiles are consecutive tile numbers, per list (kv: forward,
    # dq: dQ pass, q: dK/dV pass). The kernels then walk them as a range, as the built-in
    # kernels walk their band, instead of through the list (see _fwd_kernel).
    kv_full_range: bool = False
    dq_full_range: bool = False
    q_full_range: bool = False

    @property
    def backward_blocks(self) -> tuple[int, int]:
        """(Q rows, K/V rows) per tile of the dQ pass."""
        return self.block_m, self.backward_block_n

    @property
    def dkdv_blocks(self) -> tuple[int, int]:
        """(Q rows, K/V rows) per tile of the dK/dV pass: the dQ pass's tiles transposed."""
        return self.backward_block_n, self.block_m

    @property
    def visited_fraction(self) -> float:
        """Visited tiles over all tiles: what the kernels' cost scales with."""
        tiles = self.kv_indices.shape[-2] * self.kv_indices.shape[-1] * self.batch * self.heads
        return float(self.kv_count.sum()) / tiles


def _classify(mask: MaskMod, batch, heads, seqlen_q, seqlen_k, block_m, block_n, device):
    """(B, H, num_m, num_n) uint8: 0 empty, 1 partial, 2 full."""
    num_m, num_n = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
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


def _lists(kinds: torch.Tensor):
    """Per row: indices of partial tiles then full tiles, their counts, and the rows'
    schedule (most visited tiles first; ties in ascending order)."""
    # Sort key: partial (0) before full (1) before empty (2); stable keeps ascending tiles.
    order_key = torch.where(kinds == 1, 0, torch.where(kinds == 2, 1, 2)).to(torch.int16)
    indices = torch.sort(order_key, dim=-1, stable=True).indices.to(torch.int32)
    partial = (kinds == 1).sum(dim=-1, dtype=torch.int32)
    count = partial + (kinds == 2).sum(dim=-1, dtype=torch.int32)
    schedule = torch.sort(count, dim=-1, descending=True, stable=True).indices.to(torch.int32)
    return indices.contiguous(), partial.contiguous(), count.contiguous(), schedule.contiguous()


def _full_tiles_consecutive(indices: torch.Tensor, partial: torch.Tensor, count: torch.Tensor) -> bool:
    """Whether in every row of ``_lists`` the full tiles (positions partial..count) are
    consecutive tile numbers: true of causal, window, document and prefix masks. One host
    sync, once per cached block mask."""
    tiles = indices.shape[-1]
    if tiles == 0:
        return True
    pos = torch.arange(tiles, device=indices.device, dtype=torch.int32)
    partial, count = partial.unsqueeze(-1), count.unsqueeze(-1)
    first = indices.gather(-1, partial.clamp(max=tiles - 1).long())
    outside_full = (pos < partial) | (pos >= count)
    return bool(((indices - first == pos - partial) | outside_full).all())


@functools.lru_cache(maxsize=64)
def _cached(mask, batch, heads, seqlen_q, seqlen_k, block_m, block_n, backward_block_n, device):
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
    return BlockMask(mask, batch, heads, seqlen_q, seqlen_k, block_m, block_n, backward_block_n, *kv, *dq, *q,
                     kv_full_range=_full_tiles_consecutive(*kv[:3]),
                     dq_full_range=_full_tiles_consecutive(*dq[:3]),
                     q_full_range=_full_tiles_consecutive(*q[:3]))


def create_block_mask(mask, batch: int = 1, heads: int = 1, seqlen_q: int = 1, seqlen_k: int = 1, device=None,
                      block_m: int = 128, block_n: int = 64, backward_block_n: int | None = None) -> BlockMask:
    """Build (or fetch from the cache) the block mask of ``mask`` for one problem shape.

    batch/heads: 1 when the mask ignores b/h (it is then shared by every batch entry and
    head). Pass the result to ``flashtile.attention(..., mask_mod=mask, block_mask=bm)``
    in every layer; it is rebuilt only when the shape or the mask changes.

    block_m × block_n: the forward's tiles (queries × keys). backward_block_n: the key
    tiles of the dQ pass, which the dK/dV pass uses as query tiles; default
    ``min(block_n, 64)``, as wider ones spill in the dK/dV kernel.
    """
    mask = as_mask_mod(mask)
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
    return _cached(mask, batch, heads, seqlen_q, seqlen_k, block_m, block_n, backward_block_n, device)


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
