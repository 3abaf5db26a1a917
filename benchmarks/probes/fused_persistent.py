"""The five-product backward on persistent programs against a program per key tile and the seven-product kernels.

    python benchmarks/probes/fused_persistent.py [--headdims 64 128] [--seqlens 1024 2048 4096] [--rounds 3]
        [--causal both|yes|no] [--settings seven tile persistent lean dynamic] [--no-check]

Attempt 76 (FLASHTILE_GLUON_BWD_PERSISTENT, gluon_bwd_fused's PERSISTENT). A program per key tile
pays a fixed cost each (the CTA's start, its K, V and first Q-side tiles loaded with nothing beside
them, its dK and dV stored the same way), fitted at 1.2 steps at d64 and 1.9 at d128 in session 21
(probes/fused_program_cost.py): 13% of a d64 1k key tile's 8 steps. Persistent programs (one an SM,
key tiles pid, pid + programs, ...) load the next tile's K, V and first Q-side tiles while this one's
last steps and epilogue run. Predicted: +5-8% at d64 1k, +2-4% at 2k-4k, nothing past; the causal
1k cells, where auto runs the seven-product kernels, may then pass them. (Session 31 measured +5.3%
and +2.6% at d64 1k, nothing at 2k.) Attempt 78, "lean": without the meeting after each key tile
(d64), whose loop-carried count made the Triton 3.6 build spill in one consumer's step loop:
predicted +1-3% over "persistent" at d64, nothing at d128 (which keeps the meeting). Attempt 79,
"dynamic": the key tiles from a counter the grid shares, as the forward's dynamic scheduler: causal
d128 back to at least a program per key tile (fixed turns: 0.91x at 1k, 0.71x at 2k), the rest within
the runs' spread.

1. With it forced on (and the fused kernel), the gradients against the float64 oracle: fused_bwd.check's
   GQA case, causal and not, and one of 288 key tiles (2-3 a program on 132 SMs); the GPU tests
   (gpu_final.sh fused-persistent) cover the other shapes.
2. The kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens, H = 2048 / d, bf16),
   the settings in turn each round: "seven" (FLASHTILE_GLUON_BWD_FUSED=0), "tile" (the fused kernel,
   a program per key tile), "persistent", "lean" (persistent without the meeting after each key tile,
   attempt 78), "dynamic" (persistent on a counter the grid shares, attempt 79); medians, TFLOP/s,
   ratios: persistent / tile, persistent / seven, lean / persistent, dynamic / persistent, dynamic /
   tile (a dash where a setting was left out). --causal picks the masks timed; the oracle checks run
   both.
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

def _setting(fused: str, persistent: str = "0", skip_end_meeting: str = "0", dynamic: str = "0") -> dict:
    """The environment of one setting: the four switches' values."""
    return {hopper.FUSED_SWITCH: fused, hopper.FUSED_PERSISTENT_SWITCH: persistent,
            hopper.SKIP_END_MEETING_SWITCH: skip_end_meeting, hopper.FUSED_DYNAMIC_SWITCH: dynamic}


SETTINGS = {
    "seven": _setting("0"),
    "tile": _setting("1"),
    "persistent": _setting("1", "1"),
    "lean": _setting("1", "1", skip_end_meeting="1"),  # attempt 78: no meeting after each key tile (d64)
    "dynamic": _setting("1", "1", dynamic="1"),  # attempt 79: key tiles from a counter the grid shares
}

# The ratios printed after each row's TFLOP/s, (numerator, denominator) settings.
RATIOS = (("persistent", "tile"), ("persistent", "seven"), ("lean", "persistent"), ("dynamic", "persistent"),
          ("dynamic", "tile"))


def _ratio(medians: dict, top: str, bottom: str) -> str:
    """``top``'s TFLOP/s over ``bottom``'s, or a dash where either was not timed."""
    if top not in medians or bottom not in medians:
        return "  -  "
    return f"{medians[top] / medians[bottom]:5.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                        help="which masks to time (default both)")
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS),
                        help="the settings to check and time (default all; ratios need their settings)")
    parser.add_argument("--no-check", action="store_true", help="skip the oracle checks (timing only)")
    args = parser.parse_args()
    masks = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for name in [name for name in ("persistent", "lean", "dynamic") if name in args.settings and not args.no_check]:
        os.environ.update(SETTINGS[name])
        for head_dim in args.headdims:
            for causal in (False, True):
                check(head_dim, causal, 1000, 1100)
                check(head_dim, causal, 1000, 1100, batch=4, heads=24)
        print(f"{name}: gradients within the oracle's tolerance (d{args.headdims}, causal and not)", flush=True)
    print(f"\nbackward TFLOP/s, kernels alone (CUDA graphs), medians of {args.rounds} rounds; "
          "ratios: persistent / tile, persistent / seven, lean / persistent, dynamic / persistent, dynamic / tile "
          "(- where a setting was not timed)")
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            for causal in masks:
                times = {name: [] for name in args.settings}
                for _ in range(args.rounds):
                    for name in args.settings:
                        os.environ.update(SETTINGS[name])
                        times[name].append(time_config("bwd", head_dim, seqlen, causal))
                medians = {name: statistics.median(t) for name, t in times.items()}
                cells = "  ".join(f"{name} {medians[name]:5.0f}" for name in args.settings)
                ratios = "  ".join(_ratio(medians, top, bottom) for top, bottom in RATIOS)
                print(f"d{head_dim:<4d} N={seqlen:<6d} {'causal' if causal else 'full  '}  {cells}  {ratios}",
                      flush=True)


if __name__ == "__main__":
    main()
