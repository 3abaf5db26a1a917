"""Why the d256 forward at N = 1k reads 130-290 TFLOP/s through flashtile.attention when a CUDA
graph of its Gluon kernel reads 408-589 (session 10): host time per call, do_bench's time and the
CUDA graph's, per (head dim, causal), Gluon and Triton forward, 16k tokens, bf16, no grad.

    python benchmarks/probes/short_forward_host.py      # an sm_90 GPU
"""

from __future__ import annotations

import os
import sys

import torch

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from launch_overhead import report  # noqa: E402  (host ms per call, do_bench ms, CUDA graph ms)


def main():
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print(f"{'call':34s} | host ms  timed  graph   (each case twice)")
    for gluon in ("1", "0"):
        os.environ["FLASHTILE_GLUON"] = gluon
        for head_dim, heads in ((128, 16), (256, 8)):
            for causal in (False, True):
                q, k, v = (torch.randn(16, heads, 1024, head_dim, device=device, dtype=torch.bfloat16)
                           for _ in range(3))
                label = f"{'gluon' if gluon == '1' else 'triton'} d{head_dim} {'causal' if causal else 'full'}"
                for _ in range(2):
                    report(label, lambda: flashtile.attention(q, k, v, causal=causal, layout="bhsd"), device, True)


if __name__ == "__main__":
    main()
