"""Peak extra GPU memory of flashtile's forward + backward for one long sequence.

B = 1, heads 16, headdim 128, bf16, causal; N from 8k to 128k. Standard attention
would need the N×N scores and probabilities per head (2 · 16 · N² · 2 bytes in bf16,
and as much again for their gradients); that figure is computed, not run.

    python benchmarks/memory_scaling.py --seqlens 8192 16384 32768 65536 131072
"""

from __future__ import annotations

import argparse
import time

import torch

import flashtile
from flashtile.memory import track_peak_memory


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlens", type=int, nargs="+", default=[8192, 16384, 32768, 65536, 131072])
    args = p.parse_args()
    heads, d = 16, 128
    print(f"{'N':>7} | {'inputs':>9} | {'peak extra fwd+bwd':>19} | {'per token':>10} | {'standard S+P':>13} | time")
    for n in args.seqlens:
        q, k, v = (torch.randn(1, n, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        flashtile.attention(q, k, v, causal=True).backward(dout)  # compile outside the measurement
        for t in (q, k, v):
            t.grad = None
        torch.cuda.synchronize()
        start = time.perf_counter()
        with track_peak_memory("cuda") as mem:
            out = flashtile.attention(q, k, v, causal=True)
            out.backward(dout)
            del out
        elapsed = time.perf_counter() - start
        inputs = 4 * q.numel() * q.element_size()
        standard = 2 * heads * n * n * 2
        print(f"{n:>7} | {inputs / 2**20:7.0f} MiB | {mem.peak_bytes / 2**20:15.0f} MiB | "
              f"{mem.peak_bytes / n / 1024:7.1f} KiB | {standard / 2**30:9.1f} GiB | {elapsed:.2f} s", flush=True)
        del q, k, v, dout


if __name__ == "__main__":
    main()
