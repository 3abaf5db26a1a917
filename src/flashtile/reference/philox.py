"""Counter-based dropout randomness (Philox4x32-10), bit-identical to the kernels'.

Dropout never stores its N×N keep-mask: each (batch·head, row, column) draws its own
random number from a counter-based generator, so the backward can regenerate the
mask tile by tile. The counter is ``(column // 8, row, batch·heads_q + head, 0)``, the
key is the 64-bit seed; column c takes 16 bits of the call's output (c % 8) // 2, the
low half for even c, the high half for odd c, and is kept when they are at least
p · 65536 — exactly as ``_dropout_keep`` in ``flashtile.kernels.common`` computes it with
``tl.philox``. This PyTorch version lets the reference backend and the oracle use the
very same mask.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a·b for uint32 values held in int64 (split to avoid overflow)."""
    b_hi, b_lo = b >> 16, b & 0xFFFF
    t_lo, t_hi = a * b_lo, a * b_hi  # each < 2^48
    hi = (t_hi + (t_lo >> 16)) >> 16
    lo = (((t_hi & 0xFFFF) << 16) + t_lo) & _MASK32
    return hi, lo


def philox4x32(seed: int, c0, c1, c2, c3, rounds: int = 10):
    """Philox4x32 with key (seed low, seed high); counters are int64 tensors of uint32 values."""
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def dropout_keep(seed: int, bh: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, dropout_p: float):
    """Keep-mask for the broadcast of ``bh``, ``rows``, ``cols`` (int tensors): True = kept.

    Column c takes the 16 bits (c % 2 = 0: low, 1: high) of output (c % 8) // 2 of the
    Philox call with counter (c // 8, row, bh, 0); it is kept when they are >= p · 65536,
    compared in float32 as the kernels do (p is a float32 kernel argument there).
    """
    bh, rows, cols = torch.broadcast_tensors(bh.long(), rows.long(), cols.long())
    outs = philox4x32(seed, (cols // 8) & _MASK32, rows & _MASK32, bh & _MASK32, torch.zeros_like(cols))
    lane = (cols % 8) // 2
    r = torch.where(lane == 0, outs[0], torch.where(lane == 1, outs[1], torch.where(lane == 2, outs[2], outs[3])))
    half = torch.where(cols % 2 == 0, r & 0xFFFF, r >> 16)
    # p as the kernels get it (a float32 argument), scaled exactly (a power of two).
    threshold = float(torch.tensor(dropout_p, dtype=torch.float32)) * 65536.0
    return half.to(torch.float32) >= threshold


def dropout_keep_mask(seed: int, dropout_p: float, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int,
                      device=None) -> torch.Tensor:
    """The whole (batch, heads_q, seqlen_q, seqlen_k) keep-mask of a dropout call (debugging, small sizes).

    Pass it to ``naive_attention(..., dropout_p=p, dropout_mask=mask)`` to reproduce a
    flashtile call made with ``dropout_seed=seed`` exactly.
    """
    bh = torch.arange(batch * heads_q, device=device).view(batch, heads_q, 1, 1)
    rows = torch.arange(seqlen_q, device=device).view(1, 1, seqlen_q, 1)
    cols = torch.arange(seqlen_k, device=device).view(1, 1, 1, seqlen_k)
    return dropout_keep(seed, bh, rows, cols, dropout_p)
