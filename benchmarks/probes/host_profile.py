"""Where the host's time goes in one attention call on a GPU: cProfile of the Python path.

    python benchmarks/probes/host_profile.py [--seqlen 1024] [--headdim 128] [--calls 40] [--docs 16]

d128 bf16, 16 heads, 16k tokens, causal; forward alone (no grad) and forward + backward.
``--docs D`` masks it instead with a mask_mod (causal and D documents of equal length) and a
block mask of 128 x 128 tiles built once, the path of masks.py's document rows.
The GPU is kept busy by a sleep kernel queued first, so calls only enqueue and the figures
are the host's own. Keep calls × launches per call under ~1000: past the driver's queue
depth a launch blocks until the sleep ends, and the profile then shows that wait.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from masks import causal_documents  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--docs", type=int, default=0, help="a document mask of this many documents")
    args = parser.parse_args()
    batch, heads = 16384 // args.seqlen, 2048 // args.headdim
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))

    masking = {"causal": True}
    if args.docs:
        _, mask, block_mask = causal_documents(args.seqlen, args.docs, "cuda", block_n=128)
        masking = {"mask_mod": mask, "block_mask": block_mask}

    def forward():
        with torch.no_grad():
            flashtile.attention(q, k, v, **masking)

    def forward_backward():
        out = flashtile.attention(q, k, v, **masking)
        torch.autograd.grad(out, (q, k, v), out)

    for name, fn in (("forward", forward), ("forward+backward", forward_backward)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(1e9))
        start = time.perf_counter()
        for _ in range(args.calls):
            fn()
        host_us = (time.perf_counter() - start) / args.calls * 1e6
        torch.cuda.synchronize()
        torch.cuda._sleep(int(1e9))
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        print(f"===== {name}: host {host_us:.1f} us per call (without the profiler)")
        for order, count in (("tottime", 25), ("cumulative", 45)):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
            print(text.getvalue())


if __name__ == "__main__":
    main()
