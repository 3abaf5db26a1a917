"""A/B of FULL_RANGE (attempt 19) per mask and tile shape: the same block mask with its
*_full_range flags as built, and forced False (the list walk)."""
import dataclasses
import sys

import torch

sys.path.insert(0, "benchmarks")
from masks import time_fwd_bwd  # noqa: E402

import flashtile  # noqa: E402
from flashtile.mask_mods import and_masks, causal_mask, document_mask  # noqa: E402

n, heads, d = 16384, 16, 128
dev = "cuda"
q, k, v = (torch.randn(1, n, heads, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
causal = causal_mask()
masks = [("causal", causal)]
for docs in (4, 16, 64):
    ids = torch.arange(n, device=dev, dtype=torch.int32) // (n // docs)
    masks.append((f"{docs} docs", and_masks(causal, document_mask(ids))))
for name, mask in masks:
    for bm_, bn_ in ((128, 64), (128, 128), (64, 64)):
        bm = flashtile.create_block_mask(mask, 1, 1, n, n, device=dev, block_m=bm_, block_n=bn_)
        off = dataclasses.replace(bm, kv_full_range=False, dq_full_range=False, q_full_range=False)
        res = []
        for b in (bm, off, bm, off):
            try:
                res.append(time_fwd_bwd(lambda q, k, v: flashtile.attention(q, k, v, mask_mod=mask, block_mask=b),
                                        q, k, v))
            except Exception as e:  # noqa: BLE001
                res.append((float("nan"), float("nan")))
                print(name, bm_, bn_, type(e).__name__, str(e)[:100])
        print(f"{name:8s} {bm_}x{bn_} ranges {bm.kv_full_range},{bm.dq_full_range},{bm.q_full_range} | "
              f"range {res[0][0]:.3f}/{res[2][0]:.3f} / {res[0][1]:.2f}  list {res[1][0]:.3f}/{res[3][0]:.3f} / "
              f"{res[1][1]:.2f} ms", flush=True)
