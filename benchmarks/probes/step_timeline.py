"""Where the GPU waits in an eager training step: each kernel's start, length and the gap before it.

    python benchmarks/probes/step_timeline.py [--docs 16] [--steps 20] [--causal]

Session 18 (probes/masks_host.py) measured the 16-document step (N = 16k, d128, 16 heads,
bf16) at 0.69 ms of host per call and 0.75 ms of kernels in a CUDA graph, yet 1.11 ms eager:
the GPU waits somewhere, or runs slower, in the eager step. This probe runs ``--steps`` eager
steps back to back (no L2 flush between them, as a training loop runs) under torch.profiler
and prints, for the median step, each GPU kernel in order with its start (µs from the step's
first kernel), its duration and the idle gap before it, then the step's GPU span, busy time
and idle time; and, for the same step, when the host launched each kernel (from the
profiler's runtime events), so a gap can be read as "launched late" or "queued behind".

``--docs 0`` times built-in causal attention instead (``--causal``) or full attention.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from masks import causal_documents  # noqa: E402


def make_step(args):
    n, device = args.seqlen, torch.device("cuda")
    q, k, v = (torch.randn(1, n, 16, 128, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    if args.docs:
        _, mask, block_mask = causal_documents(n, args.docs, device, block_n=128)
        options = {"mask_mod": mask, "block_mask": block_mask}
    else:
        options = {"causal": args.causal}

    def step():
        torch.autograd.grad(flashtile.attention(q, k, v, **options), (q, k, v), dout)

    return step


def kernel_events(prof):
    """(name, start µs, end µs) of every GPU kernel and memset/memcpy, in start order."""
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows = [(e.name, e.time_range.start, e.time_range.end) for e in events]
    return sorted(rows, key=lambda row: row[1])


def launch_events(prof):
    """(start µs) of every cudaLaunchKernel-like runtime call on the host, in order."""
    names = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaMemsetAsync")
    return sorted(e.time_range.start for e in prof.events() if e.name in names)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    step = make_step(args)
    for _ in range(5):  # compile, caches, allocator
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    kernels = kernel_events(prof)
    launches = launch_events(prof)
    per_step = len(kernels) // args.steps
    if per_step == 0 or len(kernels) % args.steps:
        print(f"{len(kernels)} GPU events over {args.steps} steps: not a whole number per step")
        per_step = max(per_step, 1)
    steps = [kernels[i * per_step:(i + 1) * per_step] for i in range(args.steps)]
    spans = [s[-1][2] - s[0][1] for s in steps if s]
    median_index = sorted(range(len(spans)), key=spans.__getitem__)[len(spans) // 2]
    chosen = steps[median_index]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; N={args.seqlen}, "
          f"{f'{args.docs} documents' if args.docs else ('causal' if args.causal else 'full')}, d128, 16 heads, "
          f"bf16; {per_step} GPU events a step; the median step of {args.steps} (span {spans[median_index]:.0f} µs, "
          f"median over steps {statistics.median(spans):.0f}):")
    origin, previous_end, busy = chosen[0][1], chosen[0][1], 0.0
    step_launches = [t for t in launches if origin - 2000 <= t <= chosen[-1][2]]
    print(f"{'kernel':58s} {'start':>8s} {'length':>8s} {'gap':>7s}")
    for name, start, end in chosen:
        print(f"{name[:58]:58s} {start - origin:8.0f} {end - start:8.0f} {start - previous_end:7.0f}")
        busy += end - start
        previous_end = max(previous_end, end)
    span = chosen[-1][2] - origin
    print(f"span {span:.0f} µs: busy {busy:.0f}, idle {span - busy:.0f}")
    print("host launches (µs from the step's first kernel): "
          + " ".join(f"{t - origin:.0f}" for t in step_launches))


if __name__ == "__main__":
    main()
