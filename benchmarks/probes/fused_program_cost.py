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


QUERY_LENGTHS = (1024, 2048, 4096, 8192, 16384)  # Sq of the non-causal cases, B = 16k / Sq


def full_cases(keys) -> list:
    """The non-causal cases (B, Sq, Sk, causal=False): B·Sq = 16k queries against each Sk of ``keys``."""
    return [(16384 // sq, sq, sk, False) for sk in keys for sq in QUERY_LENGTHS]


def median_us(cases, heads: int, head_dim: int, rounds: int) -> dict:
    """{case: median µs of backward_ms} over ``rounds`` rounds, every case (B, Sq, Sk, causal) in
    turn each round."""
    times = {case: [] for case in cases}
    for _ in range(rounds):
        for batch, seqlen_q, seqlen_k, causal in cases:
            times[batch, seqlen_q, seqlen_k, causal].append(backward_ms(batch, heads, seqlen_q, seqlen_k, head_dim,
                                                                        causal))
    return {case: statistics.median(t) * 1e3 for case, t in times.items()}


def grid_of(batch: int, heads: int, seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, sms: int) -> tuple:
    """(programs, waves, steps a program) of a non-causal fused grid."""
    programs = batch * heads * math.ceil(seqlen_k / block_n)
    return programs, math.ceil(programs / sms), math.ceil(seqlen_q / block_m)


def fit(rows):
    """Least squares of time = waves·c + waves·steps·t + passes over rows (waves, steps, µs):
    (c, t, passes)."""
    a = torch.tensor([[w, w * s, 1.0] for w, s, _ in rows], dtype=torch.float64)
    b = torch.tensor([[us] for _, _, us in rows], dtype=torch.float64)
    c, t, passes = torch.linalg.lstsq(a, b).solution.flatten().tolist()
    return c, t, passes


def fused_setup(head_dim: int) -> tuple[int, int, int, int]:
    """The five-product backward forced (FLASHTILE_GLUON_BWD=1, FLASHTILE_GLUON_BWD_FUSED=1) and
    the versions printed; (BLOCK_M, BLOCK_N, heads, SMs) of a d``head_dim`` grid of 2048 / d heads."""
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    block_m, block_n, _ = hopper.BWD_FUSED[head_dim]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    return block_m, block_n, 2048 // head_dim, sms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--keys", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    block_m, block_n, heads, sms = fused_setup(args.headdim)
    cases = full_cases(args.keys)
    us = median_us(cases, heads, args.headdim, args.rounds)
    rows = []
    print(f"d{args.headdim}, non-causal, {sms} SMs; (BLOCK_M, BLOCK_N) = ({block_m}, {block_n})")
    print("   B     Sq     Sk  programs  waves  steps      ms  µs/(wave·step)")
    for case in cases:
        batch, seqlen_q, keys, _ = case
        programs, waves, steps = grid_of(batch, heads, seqlen_q, keys, block_m, block_n, sms)
        rows.append((waves, steps, us[case]))
        print(f"{batch:4d} {seqlen_q:6d} {keys:6d} {programs:9d} {waves:6d} {steps:6d} {us[case] / 1e3:7.3f} "
              f"{us[case] / (waves * steps):9.3f}")
    c, t, passes = fit(rows)
    print(f"fit: a step {t:.3f} µs, a program's fixed cost {c:.2f} µs = {c / t:.1f} steps, "
          f"the bandwidth passes {passes:.0f} µs")


if __name__ == "__main__":
    main()
