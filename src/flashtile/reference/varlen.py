"""Variable-length (packed) batches on the reference backend: the tiled algorithm per sequence.

Tensors are (1, heads, total_tokens, headdim) views of the packed (total, heads,
headdim) tensors; sequence b owns rows ``cu_seqlens[b] : cu_seqlens[b + 1]``. Each
sequence runs :mod:`.tiled` on views of its rows, so nothing is copied. The LSE is
(heads, total_q), as in flash-attn.
"""

from __future__ import annotations

import torch

from ..masks import Band
from .tiled import tiled_attention_backward, tiled_attention_forward


def _spans(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    # The reference runs on the host's schedule: reading the boundaries is fine here.
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _slopes_of(alibi_slopes, b):
    return alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes


def varlen_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale: float, band: Band,
                   softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0, dropout_seed: int = 0) -> None:
    """Writes out (1, Hq, total_q, D) and lse (Hq, total_q) for every sequence, in place."""
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(_spans(cu_seqlens_q), _spans(cu_seqlens_k))):
        if q1 == q0:
            continue
        if k1 == k0:  # no keys at all: every row sees nothing
            out[:, :, q0:q1] = 0
            lse[:, q0:q1] = float("-inf")
            continue
        _, seq_lse = tiled_attention_forward(
            q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], softmax_scale, band, softcap, _slopes_of(alibi_slopes, b),
            out=out[:, :, q0:q1], dropout_p=dropout_p, dropout_seed=dropout_seed, batch_offset=b)
        lse[:, q0:q1] = seq_lse[0]


def varlen_backward(dout, q, k, v, out, lse, dlse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale: float,
                    band: Band, softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0,
                    dropout_seed: int = 0) -> None:
    """Writes dq, dk, dv (zero-filled by the caller) for every sequence, in place."""
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(_spans(cu_seqlens_q), _spans(cu_seqlens_k))):
        if q1 == q0 or k1 == k0:  # nothing attended: the zero gradients stand
            continue
        tiled_attention_backward(
            dout[:, :, q0:q1], q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], out[:, :, q0:q1],
            lse[None, :, q0:q1], softmax_scale, band, softcap, _slopes_of(alibi_slopes, b),
            dlse=dlse[None, :, q0:q1] if dlse is not None else None,
            dq=dq[:, :, q0:q1], dk=dk[:, :, k0:k1], dv=dv[:, :, k0:k1],
            dropout_p=dropout_p, dropout_seed=dropout_seed, batch_offset=b)
