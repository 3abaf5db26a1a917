"""Rotary position embedding (RoPE) on (batch, seqlen, heads, headdim) tensors.

``cos``/``sin`` are tables of shape (max_position, rotary_dim / 2); the first
``rotary_dim`` channels of each head are rotated, the rest pass through. Two
conventions, as in flash-attn: ``interleaved=True`` rotates pairs of neighbouring
channels (x0, x1), (x2, x3), … (GPT-J); ``interleaved=False`` rotates the two halves
(x[:r/2], x[r/2:]) (GPT-NeoX, Llama).
"""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 interleaved: bool = False) -> torch.Tensor:
    """Rotate x (B, S, H, D) at integer ``positions`` (B, S); returns a new tensor in x's dtype.

    Computed in float32 (float64 for float64 input), like the reference implementations.
    """
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_cos: rotary_dim = 2 * {cos.shape[-1]} exceeds headdim {x.shape[-1]}")
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = cos[positions].to(compute)[:, :, None, :]  # (B, S, 1, r/2)
    s = sin[positions].to(compute)[:, :, None, :]
    rot, rest = x[..., :rotary_dim].to(compute), x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), rest), dim=-1)
