"""Time per kernel of one backward pass: a dense causal batch against the same tokens packed.

variants.py says *how much* slower the packed (varlen) backward is; this says *which kernel*
the time goes to, from the profiler's device times averaged over ``--iters`` calls.

    python benchmarks/kernel_times.py                       # 8 x 2048, 16 heads, d128, bf16
    python benchmarks/kernel_times.py --device cpu --seqs 2 --seqlen 64 --iters 2   # smoke test
"""

from __future__ import annotations

import argparse

import torch
from packed import dense_and_packed
from torch.profiler import ProfilerActivity, profile


def backward_kernel_times(fn, leaves, device: torch.device, iters: int) -> list[tuple[str, float, int]]:
    """(name, ms per backward, launches per backward) of each kernel, slowest first."""
    out = fn()
    dout = torch.randn_like(out)
    for _ in range(3):  # compile and warm up outside the profile
        torch.autograd.grad(out, leaves, dout, retain_graph=True)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            torch.autograd.grad(out, leaves, dout, retain_graph=True)
        if on_gpu:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        total_us = event.device_time_total if on_gpu else event.self_cpu_time_total
        if total_us > 0:
            rows.append((event.key, total_us / iters / 1e3, event.count // iters))
    return sorted(rows, key=lambda row: -row[1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--top", type=int, default=6, help="kernels listed per case")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (host op times)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cases = dense_and_packed(args.seqs, args.seqlen, args.heads, args.headdim, device, dtype)
    print(f"backward, {args.seqs} x {args.seqlen} causal, heads {args.heads}, headdim {args.headdim}, {dtype}: "
          "ms per call, launches per call")
    for name, (fn, leaves) in cases.items():
        print(f"== {name}")
        for kernel, ms, launches in backward_kernel_times(fn, leaves, device, args.iters)[: args.top]:
            print(f"  {kernel[:56]:56s} {ms:8.3f} ms  x{launches}")


if __name__ == "__main__":
    main()
