"""The varlen benchmarks' problem: causal sequences of one length, packed, beside the dense
batch of the same tokens (variants.py times the two, kernel_times.py their kernels)."""

from __future__ import annotations

import torch

import flashtile


def dense_and_packed(seqs: int, seqlen: int, heads: int, headdim: int, device, dtype) -> dict:
    """{"dense": (call, leaves), "varlen": (call, leaves)}: each call runs causal attention
    over the same random tokens, (seqs, seqlen, heads, headdim) or packed as
    (seqs · seqlen, heads, headdim); leaves are its q, k, v, which require grad."""
    q, k, v = (torch.randn(seqs, seqlen, heads, headdim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    cu = torch.arange(0, (seqs + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
    packed = [t.detach().flatten(0, 1).requires_grad_() for t in (q, k, v)]
    return {
        "dense": (lambda: flashtile.flash_attn_func(q, k, v, causal=True), (q, k, v)),
        "varlen": (lambda: flashtile.flash_attn_varlen_func(*packed, cu, cu, seqlen, seqlen, causal=True), packed),
    }
