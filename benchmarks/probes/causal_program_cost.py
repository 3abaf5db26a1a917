"""The causal five-product backward's cost per step and per program, fitted beside the non-causal kernel's.

    python benchmarks/probes/causal_program_cost.py [--headdim 128] [--rounds 3]

Session 21: the causal backward at 16k (d128) takes 5.56 ms where the non-causal kernel's own
step and program costs (probes/fused_program_cost.py: 2.53 µs a step, 4.9 µs a program) and
the grid's dispatch order give 5.19 ms: 7% over. A simulation of the dispatch (programs started
in grid order on the first free SM, gluon_common.tile_and_row_of_program's order with
hopper.causal_heads_per_group's groups) puts the order within 0.5% of a perfect packing, so
either a causal step or a causal program costs more than a non-causal one. This probe tells
which:

1. Non-causal, fused_program_cost's ten cases (B·Sq = 16k queries, Sk = 8k and 16k): a fit of
   time = waves · (c + steps · t) + passes gives c, t and the bandwidth passes.
2. Causal, Sq = Sk = N for N = 2k, 4k, 8k, 16k (B = 16k / N): every case has 2048 programs at
   d128, of N/64 − 2j steps for key tile j, so the total steps grow 8-fold while the programs
   stay: time = t · M(c / t) + passes, M the simulated makespan in steps of programs costing
   c / t + their steps, passes taken from 1. A search over c / t gives the causal c and t.
Kernels alone, CUDA graphs, medians of ``--rounds`` rounds, the fused kernel forced, bf16,
H = 2048 / d.

Measured (H200, session 21, d128): a causal step costs what a non-causal one does, 2.586 against
2.589 µs. The fixed cost per program is not pinned down: every causal case has 2048 programs,
so it trades against the passes, and this run's non-causal fit put the passes at an unphysical
-177 µs (the profiler: 122 µs, session 20), leaving the causal program at 20 µs; with 122 µs it
is ~1 µs. Taking the profiler's passes, the 16k causal backward (5331 µs) sits within 1.5% of
the non-causal costs' model, while the non-causal one (10418 µs, an earlier call) is 3.4% under its 16 full
waves: session 20's "causal at 0.533 of non-causal against the model's 0.497" is the
non-causal grid's part-empty last wave running faster than counted, not a slower causal kernel.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import sys

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_program_cost import fit, full_cases, fused_setup, grid_of, median_us  # noqa: E402


def causal_programs(rows: int, seqlen: int, head_dim: int, block_m: int, block_n: int) -> list:
    """The steps of each program of a causal fused grid (Sq = Sk = seqlen, no GQA), in grid
    order: groups of hopper.causal_heads_per_group rows, key tiles slowest within a group."""
    group = hopper.causal_heads_per_group(True, rows, seqlen, head_dim, 2, streams_for=2)
    q_tiles = math.ceil(seqlen / block_m)
    steps = [q_tiles - math.ceil(max(j * block_n - (block_m - 1), 0) / block_m)
             for j in range(math.ceil(seqlen / block_n))]
    order = []
    for first in range(0, rows, group):
        order += [s for s in steps for _ in range(min(group, rows - first))]
    return order


def makespan(programs: list, fixed: float, sms: int) -> float:
    """Steps until the last SM is done: each program starts on the first free SM, in order,
    and takes ``fixed`` + its steps."""
    free = [0.0] * sms
    end = 0.0
    for steps in programs:
        start = heapq.heappop(free)
        end = max(end, start + fixed + steps)
        heapq.heappush(free, start + fixed + steps)
    return end


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    block_m, block_n, heads, sms = fused_setup(args.headdim)
    full = full_cases((8192, 16384))
    causal_cases = [(16384 // n, n, n, True) for n in (2048, 4096, 8192, 16384)]
    us = median_us(full + causal_cases, heads, args.headdim, args.rounds)

    rows = [(*grid_of(b, heads, sq, sk, block_m, block_n, sms)[1:], us[b, sq, sk, c]) for b, sq, sk, c in full]
    c_full, t_full, passes = fit(rows)
    print(f"d{args.headdim}, {sms} SMs, (BLOCK_M, BLOCK_N) = ({block_m}, {block_n})")
    print("non-causal µs (B x Sq x Sk):",
          "  ".join(f"{b}x{sq}x{sk} {us[b, sq, sk, c]:.0f}" for b, sq, sk, c in full))
    print(f"non-causal fit: a step {t_full:.3f} µs, a program {c_full:.2f} µs = {c_full / t_full:.1f} steps, "
          f"passes {passes:.0f} µs")

    grids = {case: causal_programs(case[0] * heads, case[1], args.headdim, block_m, block_n) for case in causal_cases}
    best = None
    for tenth in range(0, 301):  # c / t from 0 to 30 steps
        ratio = tenth / 10
        spans = [makespan(grids[case], ratio, sms) for case in causal_cases]
        measured = [us[case] - passes for case in causal_cases]
        t = sum(s * m for s, m in zip(spans, measured)) / sum(s * s for s in spans)
        error = sum((t * s - m) ** 2 for s, m in zip(spans, measured))
        if best is None or error < best[0]:
            best = (error, ratio, t, spans)
    _, ratio, t_causal, spans = best
    print(f"causal fit:     a step {t_causal:.3f} µs, a program {ratio * t_causal:.2f} µs = {ratio:.1f} steps")
    print("     N  programs  steps/SM  µs measured  fit  with the non-causal costs  (over)")
    for case, span in zip(causal_cases, spans):
        programs = grids[case]
        model_full = t_full * makespan(programs, c_full / t_full, sms) + passes
        print(f"{case[1]:6d} {len(programs):9d} {sum(programs) / sms:9.0f} {us[case]:12.0f} "
              f"{t_causal * span + passes:5.0f} {model_full:10.0f}  ({us[case] / model_full - 1:+.3f})")


if __name__ == "__main__":
    main()
