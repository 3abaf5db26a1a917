"""The causal five-product backward with each program's Q tiles visited last first, against first
first (attempt 51): checked, then timed.

    python benchmarks/probes/fused_q_order.py [--headdims 128 64] [--seqlens 2048 4096 8192 16384] [--rounds 3]

Session 20's kernel breakdown (probes/kernel_breakdown.py) had the causal five-product kernel
at 0.533 of the non-causal one's time, where a model of the grid's dispatch (per-program work
and fixed cost from the non-causal times) gives 0.497; the seven-product kernels' causal
backward is at 0.50. Causal programs started together begin on different Q tiles (key tile n
at Q tile 2n), so the running programs read Q and dO and add into the dQ sum over a window of
tiles as wide as the grid's running programs, where non-causal ones walk the same tiles in
step. hopper.FUSED_Q_DESCENDING (per head dim) makes them start on the last Q tile
(gluon_common.q_tile_start).

1. With the fused kernel forced and the order reversed, gradients against the float64 oracle
   (GQA 6:2, q != k lengths both ways, d128 and d64).
2. Causal backward kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens,
   H = 2048 / d, bf16), ascending and descending in alternating rounds; medians, TFLOP/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_bwd import check  # noqa: E402
from gluon_sweep import time_config  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[2048, 4096, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    saved = dict(hopper.FUSED_Q_DESCENDING)
    for head_dim in args.headdims:
        hopper.FUSED_Q_DESCENDING[head_dim] = True
        for seqlen_q, seqlen_k in ((1000, 1100), (1100, 1000), (203, 203)):
            check(head_dim, True, seqlen_q, seqlen_k)
        print(f"d{head_dim}: causal gradients, Q tiles last first, within the oracle's tolerance", flush=True)
    print("\ncausal backward TFLOP/s, kernels alone (CUDA graphs), medians of", args.rounds, "rounds")
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            times = {False: [], True: []}
            for _ in range(args.rounds):
                for descending in (False, True):
                    hopper.FUSED_Q_DESCENDING[head_dim] = descending
                    times[descending].append(time_config("bwd", head_dim, seqlen, True))
            up, down = (statistics.median(times[d]) for d in (False, True))
            print(f"d{head_dim:<4d} N={seqlen:<6d} first-first {up:5.0f}   last-first {down:5.0f}   "
                  f"ratio {down / up:5.3f}   (rounds: {' '.join(f'{t:.0f}' for t in times[True])})", flush=True)
    hopper.FUSED_Q_DESCENDING.clear()
    hopper.FUSED_Q_DESCENDING.update(saved)


if __name__ == "__main__":
    main()
