"""A Gluon kernel under each setting of one switch: checked against the oracle, then timed in turn.

What probes/dq_swizzle.py, exp_poly.py, hoist_stats.py (the five-product backward) and
row_tree.py (the dense forward) share, each naming its switch and settings:

1. Under each setting, the outputs (forward) or gradients (backward) against the float64 oracle
   (GQA 6:2, 1000 queries against 1100 keys, 203 against 203), causal and not, at every head dim.
2. The kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens, H = 2048 / d,
   bf16), the settings in turn each round; medians, TFLOP/s, each ratio to the first setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import flashtile
from flashtile.testing import assert_close_to_oracle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_bwd import check  # noqa: E402
from gluon_sweep import time_config  # noqa: E402


def arguments(description: str, settings: list, headdims: list, seqlens: list) -> argparse.Namespace:
    """--headdims, --seqlens, --rounds and --settings (the first: the one the others are compared with)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--headdims", nargs="+", type=int, default=headdims)
    parser.add_argument("--seqlens", nargs="+", type=int, default=seqlens)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=settings,
                        help="the switch's values; the first is the one the others are compared with")
    return parser.parse_args()


def check_forward(head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int) -> None:
    """The Gluon forward's output against the float64 oracle (GQA 6:2), as fused_bwd.check does the gradients."""
    q = torch.randn(1, 6, seqlen_q, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, seqlen_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = flashtile.attention(q, k, v, causal=causal, layout="bhsd")
    expected, plain = (flashtile.naive_attention(q, k, v, causal=causal, layout="bhsd", upcast=upcast)
                       for upcast in (True, False))
    assert_close_to_oracle("out", out, expected, plain)


def check_and_time(switch: str, args: argparse.Namespace, which: str = "bwd") -> None:
    """Steps 1 and 2 of this module's docstring for the environment variable ``switch``: the
    backward (``which`` "bwd") with the fused kernel forced (FLASHTILE_GLUON_BWD_FUSED=1), or the
    Gluon forward ("fwd", FLASHTILE_GLUON=1)."""
    if which == "fwd":
        os.environ["FLASHTILE_GLUON"] = "1"
    else:
        os.environ["FLASHTILE_GLUON_BWD"] = "1"
        os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for setting in args.settings:
        os.environ[switch] = setting
        for head_dim in args.headdims:
            for causal in (False, True):
                for seqlen_q, seqlen_k in ((1000, 1100), (203, 203)):
                    (check_forward if which == "fwd" else check)(head_dim, causal, seqlen_q, seqlen_k)
        print(f"{switch}={setting}: {'outputs' if which == 'fwd' else 'gradients'} within the oracle's tolerance "
              f"(d{args.headdims}, causal and not)", flush=True)
    print(f"\n{'forward' if which == 'fwd' else 'backward'} TFLOP/s by {switch}, kernels alone (CUDA graphs), "
          f"medians of {args.rounds} rounds")
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                times = {s: [] for s in args.settings}
                for _ in range(args.rounds):
                    for setting in args.settings:
                        os.environ[switch] = setting
                        times[setting].append(time_config(which, head_dim, seqlen, causal))
                medians = {s: statistics.median(t) for s, t in times.items()}
                base = medians[args.settings[0]]
                cells = "   ".join(f"{s:>3s}: {medians[s]:5.0f} ({medians[s] / base:5.3f})" for s in args.settings)
                print(f"d{head_dim:<4d} N={seqlen:<6d} {'causal' if causal else 'full  '}  {cells}", flush=True)
