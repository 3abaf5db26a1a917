"""Backward-only A/B of the full-tile ranges per pass (dQ list, dK/dV list) on short documents."""
import dataclasses
import statistics

import torch

import flashtile
from flashtile.mask_mods import and_masks, causal_mask, document_mask

n, heads, d, dev = 16384, 16, 128, "cuda"
q, k, v = (torch.randn(1, n, heads, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)


def bwd_ms(fn, reps=60):
    out = fn()
    for _ in range(5):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


for docs in (1, 16, 64):
    ids = torch.arange(n, device=dev, dtype=torch.int32) // (n // docs)
    mask = and_masks(causal_mask(), document_mask(ids))
    bm = flashtile.create_block_mask(mask, 1, 1, n, n, device=dev)
    variants = {"both ranges": bm, "dq list": dataclasses.replace(bm, dq_full_range=False),
                "dkdv list": dataclasses.replace(bm, q_full_range=False),
                "both lists": dataclasses.replace(bm, dq_full_range=False, q_full_range=False)}
    res = {name: [] for name in variants}
    for _ in range(3):
        for name, b in variants.items():
            res[name].append(bwd_ms(lambda: flashtile.attention(q, k, v, mask_mod=mask, block_mask=b)))
    print(f"{docs:3d} docs bwd ms: " + "  ".join(f"{name} {min(t):.3f}-{max(t):.3f}" for name, t in res.items()),
          flush=True)
