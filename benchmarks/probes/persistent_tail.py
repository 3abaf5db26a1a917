"""Whether the non-causal 1k backward loses its last round of persistent programs to the tail.

    python benchmarks/probes/persistent_tail.py [--rounds 3]

At 1k tokens the non-causal five-product backward runs on persistent programs in fixed turns, one
key tile (an item, all its Q tiles) at a time. The bench's shapes give 4096 items at d64 (16 × 32
heads × 8 key tiles) and 2048 at d128 (16 × 16 × 8) for 132 programs: 31.03 and 15.52 items a
program, so the last round runs 4 and 68 programs while the others wait, and each costs a whole
round of an item. Beside each bench shape this times one whose items fill whole rounds (d64: 15 ×
33 heads, 3960 items, 30 rounds; d128: 12 × 22 heads, 2112 items, 16 rounds), kernels only
(hopper.backward replayed from a CUDA graph), and prints µs, µs per item and µs per round.

If the last round costs a whole one, time goes with the rounds: d64 4096 items take 32/30 of 3960's
time (1.067) where their work is 1.034; d128 2112 items take what 2048 take (1.00, work 1.031).
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from fused_program_cost import backward_ms  # (beside this file)

from flashtile.kernels import hopper

# (head dim, batch, heads): the bench's shape, then one of whole rounds
SHAPES = [(64, 16, 32), (64, 15, 33), (128, 16, 16), (128, 12, 22)]
SEQLEN = 1024
KEY_TILE = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    programs = hopper.sm_count(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}, {programs} SMs, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}; non-causal backward, N = {SEQLEN}, CUDA graphs, median of "
          f"{args.rounds} rounds")
    times = {shape: [] for shape in SHAPES}
    for _ in range(args.rounds):
        for shape in SHAPES:
            head_dim, batch, heads = shape
            times[shape].append(backward_ms(batch, heads, SEQLEN, SEQLEN, head_dim))
    for head_dim, batch, heads in SHAPES:
        ms = statistics.median(times[head_dim, batch, heads])
        items = batch * heads * (SEQLEN // KEY_TILE)
        rounds = math.ceil(items / programs)
        print(f"d{head_dim} {batch} x {heads} heads: {items} items, {items / programs:.2f} a program, {rounds} rounds: "
              f"{ms * 1e3:.1f} µs, {ms * 1e3 / items:.3f} µs an item, {ms * 1e3 / rounds:.2f} µs a round")


if __name__ == "__main__":
    main()
