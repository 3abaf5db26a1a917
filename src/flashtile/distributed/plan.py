"""Which kernel calls one ring step makes: the band of every (query block, key block) pair.

Globally (the whole sequence, seqlen_q = seqlen_k = N) query position ``p`` sees key
position ``t`` when ``p − left ≤ t ≤ p + right`` (``None`` = unbounded; causal is
``right = 0``). A rank holds its queries and, at each ring step, one other rank's
keys, each as one or two contiguous runs of global positions (see
:mod:`.sharding`). The attention op takes a band in *local* coordinates, aligned
bottom-right: local row ``i`` sees local key ``j`` when
``i + (Lk − Lq) − left' ≤ j ≤ i + (Lk − Lq) + right'``, with any integer bounds.

For a query run starting at global ``a`` and a key run starting at global ``b``
the local band is the global one shifted by ``delta = a − b − (Lk − Lq)``::

    right' = right + delta,    left' = left − delta

so every pair of runs is one op call. Fewer, larger calls are faster, so the
planner first tries to cover a step with one call over all the rank's queries
and the whole key block, then one call per key run or per query run, and only
then one call per pair; a piece is usable when the exact visibility of its rows
(computed from global positions) equals the visibility some band gives. Pieces
that see nothing are skipped, and a band that masks nothing becomes
``(None, None)`` so the kernel runs its unmasked path.

For zigzag shards under a causal mask (rank r holds chunks r and 2W−1−r), with
the key block from rank s, this gives one call per step::

    s == r:  all queries × all keys, causal (right' = 0)     2C × 2C, half masked
    s <  r:  all queries × key chunk s, no mask              2C × C
    s >  r:  query chunk 2W−1−r × all keys, no mask          C × 2C

(chunk pair (a, b) is fully visible if b < a, diagonal-causal if a == b, invisible
if b > a), so every rank does the same work at every step.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Optional

import torch

from ..masks import Band
from .sharding import Segment


class BlockCall(NamedTuple):
    """One op call: local query rows [q_lo, q_hi) against K/V block rows [k_lo, k_hi), with a local band."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    window_left: Optional[int]
    window_right: Optional[int]


class _Piece(NamedTuple):
    """A run of consecutive local rows [lo, hi), made of one or more global segments."""

    lo: int
    hi: int
    segments: tuple[Segment, ...]


_EMPTY = "empty"  # the piece sees no key: no call


def _pieces(segments: tuple[Segment, ...]) -> tuple[_Piece, tuple[_Piece, ...]]:
    """The whole shard as one piece, and each segment as its own piece."""
    singles, lo = [], 0
    for seg in segments:
        singles.append(_Piece(lo, lo + seg[1], (seg,)))
        lo += seg[1]
    return _Piece(0, lo, segments), tuple(singles)


def _positions(piece: _Piece) -> torch.Tensor:
    return torch.cat([torch.arange(start, start + n, dtype=torch.int64) for start, n in piece.segments])


def _run_starts(segments: tuple[Segment, ...]):
    """(global start, local start) of each run of a piece."""
    local = 0
    for start, n in segments:
        yield start, local
        local += n


def _band_candidates(bound: Optional[int], sign: int, qp: _Piece, kp: _Piece, off: int) -> list[Optional[int]]:
    """Local bounds worth trying for one side: None first (no mask), then each run pair's shift."""
    out: list[Optional[int]] = [None]
    if bound is None:
        return out
    for a, q_local in _run_starts(qp.segments):
        for b, k_local in _run_starts(kp.segments):
            delta = (a - q_local) - (b - k_local) - off
            candidate = bound + sign * delta  # right' = right + delta, left' = left - delta
            if candidate not in out:
                out.append(candidate)
    return out


def _fit(qp: _Piece, kp: _Piece, band: Band):
    """The local band (left', right') giving exactly the global visibility on this piece pair.

    Returns ``_EMPTY`` when no row sees a key, None when no band matches.
    """
    q_pos, k_pos = _positions(qp), _positions(kp)
    lq, lk = len(q_pos), len(k_pos)
    off = lk - lq
    # Exact visibility: the keys of a row form one run of k_pos (sorted), [lo, hi).
    lo = torch.zeros(lq, dtype=torch.int64) if band.left is None else torch.searchsorted(k_pos, q_pos - band.left)
    hi = (torch.full((lq,), lk, dtype=torch.int64) if band.right is None
          else torch.searchsorted(k_pos, q_pos + band.right, right=True))
    seen = lo < hi
    if not bool(seen.any()):
        return _EMPTY
    i = torch.arange(lq, dtype=torch.int64)
    for left in _band_candidates(band.left, -1, qp, kp, off):
        lo_b = torch.zeros(lq, dtype=torch.int64) if left is None else (i + off - left).clamp(0, lk)
        for right in _band_candidates(band.right, +1, qp, kp, off):
            hi_b = torch.full((lq,), lk, dtype=torch.int64) if right is None else (i + off + right + 1).clamp(0, lk)
            seen_b = lo_b < hi_b
            if bool((seen_b == seen).all() and (lo_b == lo)[seen].all() and (hi_b == hi)[seen].all()):
                return left, right
    return None


@lru_cache(maxsize=256)
def plan_block(q_segments: tuple[Segment, ...], k_segments: tuple[Segment, ...], band: Band) -> tuple[BlockCall, ...]:
    """The op calls that give the local queries' attention over one K/V block, fewest first.

    q_segments, k_segments: (global start, length) runs in storage order, ascending.
    An empty result means the block is invisible to every local query.
    """
    starts = [start for start, _ in k_segments]
    assert starts == sorted(starts), f"k_segments: expected ascending runs, got {k_segments}"
    q_all, q_singles = _pieces(q_segments)
    k_all, k_singles = _pieces(k_segments)
    options = [
        [(q_all, k_all)],
        [(q_all, kp) for kp in k_singles],
        [(qp, k_all) for qp in q_singles],
        [(qp, kp) for qp in q_singles for kp in k_singles],
    ]
    best: Optional[list[BlockCall]] = None
    for option in options:
        calls: Optional[list[BlockCall]] = []
        for qp, kp in option:
            fit = _fit(qp, kp, band)
            if fit is None:
                calls = None
                break
            if fit is not _EMPTY:
                calls.append(BlockCall(qp.lo, qp.hi, kp.lo, kp.hi, *fit))
        if calls is not None and (best is None or len(calls) < len(best)):
            best = calls
    # One run against one run is always a band (the shift above), so the last option always fits.
    assert best is not None, (q_segments, k_segments, band)
    return tuple(best)
