"""A first look at the block-sparse Gluon forward on a GPU (FLASHTILE_GLUON=1): a few block
masks against the dense Triton path with the same mask, printed as max |difference|; run
before the test suite so that a hang or a wrong answer shows in seconds.

    FLASHTILE_GLUON=1 python benchmarks/probes/listed_smoke.py
"""

from __future__ import annotations

import os
import time

import torch

import flashtile
from flashtile.kernels import hopper
from flashtile.mask_mods import causal_mask, dense_mask, document_mask


def main() -> None:
    os.environ["FLASHTILE_GLUON"] = "1"
    calls = []
    run = hopper._listed_forward

    def counted(*args):
        calls.append(args[7].block_n)
        return run(*args)

    hopper._listed_forward = counted
    ids = (torch.arange(1000, device="cuda") // 300).to(torch.int32)
    for name, mask, d, block_n in (("causal", causal_mask(), 128, 128), ("causal", causal_mask(), 128, 64),
                                   ("documents", document_mask(ids), 64, 128), ("causal", causal_mask(), 256, 64)):
        q, k, v = (torch.randn(2, 1000, 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        bm = flashtile.create_block_mask(mask, 1, 1, 1000, 1000, "cuda", block_m=128, block_n=block_n)
        start = time.perf_counter()
        out = flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        visible = dense_mask(mask, 1, 1, 1000, 1000, "cuda")
        bias = torch.zeros(visible.shape, device="cuda").masked_fill(~visible, float("-inf"))
        ref = flashtile.naive_attention(q.double(), k.double(), v.double(), bias=bias.double())
        error = (out.double() - ref).abs().max().item()
        print(f"{name:10s} d{d} n{block_n}: max |out - oracle| {error:.2e} (first call {seconds:.1f} s), "
              f"listed calls {len(calls)}", flush=True)


if __name__ == "__main__":
    main()
