"""Kernels of the 1k backward in CUDA graphs (hopper.backward), the bench's shapes: one tree."""
import os, statistics, sys
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from timing import graph_ms
from flashtile.kernels import hopper
out_lines = []
for d in (64, 128):
    for causal in (False, True):
        q, k, v = (torch.randn(16, 2048 // d, 1024, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        scale = d ** -0.5
        o = torch.empty_like(q)
        lse = hopper.forward(q, k, v, o, scale, causal)
        do = torch.randn_like(q)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        ms = [graph_ms(lambda: hopper.backward(q, k, v, o, do, lse, None, scale, causal, dq, dk, dv)) for _ in range(3)]
        print(f"{sys.argv[1]} d{d} {'causal' if causal else 'full'}: {statistics.median(ms) * 1e3:.1f} µs", flush=True)
