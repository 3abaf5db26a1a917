"""How a sequence is cut across the ranks of a group, and the helpers that cut and rejoin it.

Two layouts, for a sequence of N tokens over W ranks, each rank holding N / W::

    contiguous   rank r holds tokens [r·N/W, (r+1)·N/W)
    zigzag       cut into 2W equal chunks; rank r holds chunks r and 2W−1−r

                 W = 2, chunks of N/4:   c0  c1  c2  c3
                                         r0  r1  r1  r0

Under a causal mask the contiguous layout gives the last rank W times the work of
the first (its queries see every key); zigzag pairs an early chunk with a late one,
so every rank does the same work at every ring step. Without a mask the layout does
not change the work.

A rank's shard is described by its *segments*: the (global start, length) of each
contiguous run of tokens it holds, in the order they are stored. Everything that
needs global positions (the ring's block masks, Ulysses' reordering, position ids
for rotary embeddings) derives them from :func:`shard_segments`.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import Tensor

SHARDINGS = ("zigzag", "contiguous")

Segment = tuple[int, int]  # (global start, length)


def check_sharding(sharding: str) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: expected one of {', '.join(repr(s) for s in SHARDINGS)}, got {sharding!r}")


def _check_world(world_size: int, rank: int | None = None) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size):
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank!r}")


def pieces_per_rank(sharding: str) -> int:
    """How many equal chunks of the sequence each rank holds (the local length must divide by it)."""
    return 2 if sharding == "zigzag" else 1


def shard_segments(sharding: str, world_size: int, rank: int, local_len: int) -> tuple[Segment, ...]:
    """The (global start, length) runs of the tokens ``rank`` holds, in storage order.

    ``local_len`` is the rank's shard length (N / world_size); for zigzag it must be even.
    """
    check_sharding(sharding)
    if sharding == "contiguous":
        return ((rank * local_len, local_len),)
    if local_len % 2:
        raise ValueError(f"zigzag sharding: the local seqlen must be even (two chunks per rank), got {local_len}")
    chunk = local_len // 2
    return ((rank * chunk, chunk), ((2 * world_size - 1 - rank) * chunk, chunk))


def _chunk_order(sharding: str, world_size: int) -> list[int]:
    """Global chunk indices in the order the ranks' shards lie when concatenated rank by rank."""
    if sharding == "contiguous":
        return list(range(world_size))
    return [c for r in range(world_size) for c in (r, 2 * world_size - 1 - r)]


def shard(x: Tensor, dim: int, world_size: int, rank: int, sharding: str = "zigzag") -> Tensor:
    """The part of the full sequence ``x`` (sequence along ``dim``) that ``rank`` holds.

    ``x.shape[dim]`` must divide by ``world_size`` (contiguous) or ``2·world_size`` (zigzag).
    Differentiable; the result is a new contiguous tensor for zigzag, a view for contiguous.
    """
    check_sharding(sharding)
    _check_world(world_size, rank)
    n_chunks = world_size * pieces_per_rank(sharding)
    if x.shape[dim] % n_chunks:
        raise ValueError(f"x: the sequence length along dim {dim} ({x.shape[dim]}) must divide by {n_chunks} "
                         f"for {sharding} sharding over {world_size} ranks")
    chunks = x.chunk(n_chunks, dim)
    if sharding == "contiguous":
        return chunks[rank]
    return torch.cat([chunks[rank], chunks[n_chunks - 1 - rank]], dim)


def unshard(shards: Union[Tensor, Sequence[Tensor]], dim: int, world_size: int, sharding: str = "zigzag") -> Tensor:
    """The full sequence from every rank's shard: the inverse of :func:`shard`.

    ``shards``: a list of the ranks' shards in rank order, or one tensor holding them
    concatenated in rank order along ``dim`` (what ``all_gather`` + ``cat`` gives).
    """
    check_sharding(sharding)
    _check_world(world_size)
    gathered = torch.cat(list(shards), dim) if not isinstance(shards, Tensor) else shards
    order = _chunk_order(sharding, world_size)
    if gathered.shape[dim] % len(order):
        raise ValueError(f"shards: the gathered length along dim {dim} ({gathered.shape[dim]}) must divide by "
                         f"{len(order)} for {sharding} sharding over {world_size} ranks")
    pieces = gathered.chunk(len(order), dim)
    in_global_order = [pieces[order.index(c)] for c in range(len(order))]
    return torch.cat(in_global_order, dim)


def position_ids(seqlen: int, world_size: int, rank: int, sharding: str = "zigzag", device=None) -> Tensor:
    """Global positions (int64, (seqlen / world_size,)) of the tokens ``rank`` holds: feed them to rotary."""
    check_sharding(sharding)
    _check_world(world_size, rank)
    if seqlen % (world_size * pieces_per_rank(sharding)):
        raise ValueError(f"seqlen: must divide by {world_size * pieces_per_rank(sharding)} for {sharding} "
                         f"sharding over {world_size} ranks, got {seqlen}")
    segments = shard_segments(sharding, world_size, rank, seqlen // world_size)
    return torch.cat([torch.arange(start, start + n, device=device) for start, n in segments])


def zigzag_shard(x: Tensor, dim: int, world_size: int, rank: int) -> Tensor:
    """Rank ``rank``'s zigzag shard of ``x``: chunks ``rank`` and ``2·world_size−1−rank`` of 2·world_size."""
    return shard(x, dim, world_size, rank, "zigzag")


def zigzag_unshard(shards: Union[Tensor, Sequence[Tensor]], dim: int, world_size: int) -> Tensor:
    """The full sequence from zigzag shards (a list in rank order, or their concatenation)."""
    return unshard(shards, dim, world_size, "zigzag")


def zigzag_position_ids(seqlen: int, world_size: int, rank: int, device=None) -> Tensor:
    """Global positions of rank ``rank``'s zigzag shard of a ``seqlen``-token sequence."""
    return position_ids(seqlen, world_size, rank, "zigzag", device)
