"""Which (query, key) pairs may attend: causal and sliding-window bands.

Every backend shares one rule. With ``offset = seqlen_k - seqlen_q`` (causal masks
are aligned bottom-right, as in flash-attn >= 2.1), query row ``i`` may see key
``j`` when

    i + offset - window_left  <=  j  <=  i + offset + window_right

where a missing bound (``None``; ``-1`` in flash-attn's ``window_size``) means
"unbounded" on that side. ``causal=True`` is the band with ``window_right = 0``.
Internally the bounds may be any integers, negative too: PyTorch's top-left causal
mask for seqlen_q < seqlen_k is the band ``right = seqlen_q - seqlen_k``. For seqlen_q = 3, seqlen_k = 5, causal::

    keys  0 1 2 3 4
    q0    x x x . .
    q1    x x x x .
    q2    x x x x x

and for seqlen_q = 5, seqlen_k = 3 the first two query rows see nothing (their
output is 0 and their LSE is -inf)::

    keys  0 1 2
    q0    . . .
    q1    . . .
    q2    x . .
    q3    x x .
    q4    x x x

The tile-range helpers below are what makes the tiled algorithm skip work: a Q tile
only visits the K/V tiles that intersect its band, and ``full_*`` bounds say which
of those need no mask at all.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

class Band(NamedTuple):
    """A normalized attention band: ``left``/``right`` are None when unbounded."""

    left: int | None
    right: int | None

    @property
    def is_full(self) -> bool:
        return self.left is None and self.right is None

    def clamped(self, seqlen_q: int, seqlen_k: int) -> "Band":
        """The same band with a bound that hides no key of these lengths dropped (a window
        wider than the sequence): key j >= i + offset - left holds for every pair once
        left >= seqlen_k - 1, and j <= i + offset + right once right >= seqlen_q - 1. The
        kernels then take the plain (causal or full) path for it."""
        left = None if self.left is not None and self.left >= seqlen_k - 1 else self.left
        right = None if self.right is not None and self.right >= seqlen_q - 1 else self.right
        return Band(left, right)


def normalize_window(causal: bool, window_size: tuple[int, int]) -> Band:
    """Turn flash-attn's ``(causal, window_size)`` pair into one band.

    Any negative bound means unbounded, as in flash-attn; ``causal`` caps the right
    side at 0 (a query never sees keys after its own bottom-right-aligned position).
    """
    left, right = (int(w) for w in window_size)
    left = None if left < 0 else left
    right = None if right < 0 else right
    if causal:
        right = 0
    return Band(left, right)


def band_mask(seqlen_q: int, seqlen_k: int, band: Band, device=None) -> torch.Tensor:
    """Boolean (seqlen_q, seqlen_k) mask, True where query i may attend to key j."""
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    allowed = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if band.left is not None:
        allowed &= j >= i - band.left
    if band.right is not None:
        allowed &= j <= i + band.right
    return allowed


def alibi_bias(slopes: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """ALiBi bias ``-slope * |i + seqlen_k - seqlen_q - j|`` (flash-attn's convention).

    slopes: (heads,) or (batch, heads), float32. Returns (1 or batch, heads, seqlen_q,
    seqlen_k) in slopes' dtype.
    """
    i = torch.arange(seqlen_q, device=slopes.device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=slopes.device)[None, :]
    distance = (i - j).abs().to(slopes.dtype)
    if slopes.dim() == 1:
        slopes = slopes[None]
    return -slopes[:, :, None, None] * distance


def key_range(q_lo: int, q_hi: int, seqlen_q: int, seqlen_k: int, band: Band) -> tuple[int, int]:
    """Keys ``[lo, hi)`` that any query row in ``[q_lo, q_hi)`` may see."""
    offset = seqlen_k - seqlen_q
    lo = 0 if band.left is None else max(0, q_lo + offset - band.left)
    hi = seqlen_k if band.right is None else min(seqlen_k, q_hi - 1 + offset + band.right + 1)
    return lo, max(lo, hi)


def query_range(k_lo: int, k_hi: int, seqlen_q: int, seqlen_k: int, band: Band) -> tuple[int, int]:
    """Query rows ``[lo, hi)`` that see at least one key in ``[k_lo, k_hi)``.

    Key j is seen by rows i with j - offset - right <= i <= j - offset + left: the same band
    with queries and keys swapped (offset negated, left and right exchanged).
    """
    return key_range(k_lo, k_hi, seqlen_k, seqlen_q, Band(band.right, band.left))
