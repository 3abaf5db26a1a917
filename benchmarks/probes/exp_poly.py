"""The five-product backward with part of its exponentials on the FMA units: checked, then timed.

    python benchmarks/probes/exp_poly.py [--headdims 64 128] [--seqlens 4096 16384] [--rounds 3]

kernels/exp2_split.py computes 1 or 2 of every 4 exponentials by a degree-3 polynomial (~10 FMA
and integer instructions each) instead of MUFU.EX2. The SFU does 16 exponentials a clock per SM:
a consumer warpgroup's tile is 64 keys × 128 queries at d64 (~512 SFU clocks a step, of a step of
~5300 at 3.0 µs) and 64 × 64 at d128 (~256 of ~4400), and the consumer waits on it before its dV
and dK products (session 21's ncu: "short scoreboard" stalls, mostly at the SFU's results, 13% of
the consumers' samples at d128). Predicted: with 1 of 4 the SFU phase shortens by a quarter, the
polynomial's instructions issuing beside it; +2-3% at d64, +1-2% at d128; 2 of 4 about the same,
issue slots then the limit.
Measured (H200, session 21, 4k and 16k, against 0): gradients within tolerance for 1 and 2. One run
(3 rounds): 1 of 4 at d128 1.010-1.020, at d64 0.945-1.023; 2 of 4 0.931-1.023. The next (5
rounds, 0 and 1 only): d128 0.981-1.010, d64 0.967-1.018. No gain beyond the runs' spread: off.

1. With each setting, the gradients against the float64 oracle (fused_bwd.check: GQA 6:2, 1000
   queries against 1100 keys, 203 against 203), causal and not.
2. The backward's kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens,
   H = 2048 / d, bf16), the settings in turn each round; medians, TFLOP/s, each ratio to 0.
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
    parser.add_argument("--headdims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[4096, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=["0", "1", "2"],
                        help="EXP_POLY values; the first is the one the others are compared with")
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for setting in args.settings:
        os.environ[hopper.EXP_POLY_SWITCH] = setting
        for head_dim in args.headdims:
            for causal in (False, True):
                for seqlen_q, seqlen_k in ((1000, 1100), (203, 203)):
                    check(head_dim, causal, seqlen_q, seqlen_k)
        print(f"EXP_POLY {setting}: gradients within the oracle's tolerance (d{args.headdims}, causal and not)",
              flush=True)
    print("\nbackward TFLOP/s, kernels alone (CUDA graphs), medians of", args.rounds, "rounds")
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                times = {s: [] for s in args.settings}
                for _ in range(args.rounds):
                    for setting in args.settings:
                        os.environ[hopper.EXP_POLY_SWITCH] = setting
                        times[setting].append(time_config("bwd", head_dim, seqlen, causal))
                medians = {s: statistics.median(t) for s, t in times.items()}
                base = medians[args.settings[0]]
                cells = "   ".join(f"{s}: {medians[s]:5.0f} ({medians[s] / base:5.3f})" for s in args.settings)
                print(f"d{head_dim:<4d} N={seqlen:<6d} {'causal' if causal else 'full  '}  {cells}", flush=True)


if __name__ == "__main__":
    main()
