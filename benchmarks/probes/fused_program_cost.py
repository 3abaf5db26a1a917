"""The five-product backward's fixed cost per program: the same work cut into programs of different lengths.

    python benchmarks/probes/fused_program_cost.py [--headdim 128] [--keys 8192 16384] [--rounds 3]

Session 20 left the causal fused kernel at 0.533 of its non-causal time where a dispatch model
gives 0.497, with DRAM and L2 ruled out (probes/fused_bwd_ncu.py). A causal grid has as many
programs as a non-causal one over half the work, so a large fixed cost per program (K/V loads,
pipeline fill, the dK/dV epilogue, the last dQ reductions' drain) would explain it. This probe
measures that cost without touching the kernel: non-causal, Sk = each of ``--keys``, and B·Sq =
16k queries cut as B × Sq with Sq = 1k, 2k, 4k, 8k, 16k. A program (one key tile of BLOCK_N)
runs Sq / BLOCK_M steps (16 to 256 at d128, 8 to 128 at d64), and there are B·H·Sk / BLOCK_N of
them. With t the time of one step and c the fixed cost of a program,

    time ≈ ceil(programs / SMs) · (c + steps · t) + passes

(passes: the preprocess, the dQ sum's zeroing and conversion: B·Sq rows in every case). At one
Sk every case has the same tile pairs, so waves · steps barely moves and t could not be told
from passes; the second Sk doubles the work and separates them. A least-squares fit over all
cases gives c, t and passes (µs; ``c / t`` is the cost in steps).
Kernels alone, CUDA graphs (benchmarks/timing.graph_ms), medians of ``--rounds`` rounds, the
fused kernel forced (FLASHTILE_GLUON_BWD_FUSED=1), bf16, H = 2048 / d.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

from flashtile.kernels import hopper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import graph_ms  # noqa: E402


def backward_ms(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool = False) -> float:
    """Median ms of the preprocess + fused kernel + conversion, one backward."""
    q, dout = (torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(batch, heads, seqlen_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale = head_dim ** -0.5
    out = torch.empty_like(q)
    lse = hopper.forward(q, k, v, out, scale, causal)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    return graph_ms(lambda: hopper.backward(q, k, v, out, dout, lse, None, scale, causal, dq, dk, dv))


def fit(rows):
    """Least squares of time = waves·c + waves·steps·t + passes over rows (waves, steps, µs):
    (c, t, passes)."""
    a = torch.tensor([[w, w * s, 1.0] for w, s, _ in rows], dtype=torch.float64)
    b = torch.tensor([[us] for _, _, us in rows], dtype=torch.float64)
    c, t, passes = torch.linalg.lstsq(a, b).solution.flatten().tolist()
    return c, t, passes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--keys", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    block_m, block_n, _ = hopper.BWD_FUSED[args.headdim]
    heads = 2048 // args.headdim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    cases = [(16384 // sq, sq, keys) for keys in args.keys for sq in (1024, 2048, 4096, 8192, 16384)]
    times = {case: [] for case in cases}
    for _ in range(args.rounds):
        for batch, seqlen_q, keys in cases:
            times[batch, seqlen_q, keys].append(backward_ms(batch, heads, seqlen_q, keys, args.headdim))
    rows = []
    print(f"d{args.headdim}, non-causal, {sms} SMs; (BLOCK_M, BLOCK_N) = ({block_m}, {block_n})")
    print("   B     Sq     Sk  programs  waves  steps      ms  µs/(wave·step)")
    for batch, seqlen_q, keys in cases:
        programs = batch * heads * math.ceil(keys / block_n)
        waves = math.ceil(programs / sms)
        steps = math.ceil(seqlen_q / block_m)
        ms = statistics.median(times[batch, seqlen_q, keys])
        rows.append((waves, steps, ms * 1e3))
        per_step = ms * 1e3 / (waves * steps)
        print(f"{batch:4d} {seqlen_q:6d} {keys:6d} {programs:9d} {waves:6d} {steps:6d} {ms:7.3f} {per_step:9.3f}")
    c, t, passes = fit(rows)
    print(f"fit: a step {t:.3f} µs, a program's fixed cost {c:.2f} µs = {c / t:.1f} steps, "
          f"the bandwidth passes {passes:.0f} µs")


if __name__ == "__main__":
    main()
