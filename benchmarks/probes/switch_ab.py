"""The five-product backward or the dense forward under each setting of one switch: checked, then timed in turn.

What probes/dq_swizzle.py, probes/exp_poly.py and probes/fwd_spread.py share (each names its
switch and settings). The forward's mode also served attempts 71-73 (session 29) and 75 (session
30: two switches at once, a character of the setting each), whose switches and probes were taken
out after they measured no gain (in git at 3ebe472, 1b0faa4 and c56a616).

1. Under each setting, the gradients against the float64 oracle (fused_bwd.check: GQA 6:2, 1000
   queries against 1100 keys, 203 against 203, 900 against 333), causal and not, at every head dim;
   for the forward, O and the LSE (forward_check.forward_verdict, the same shapes).
2. The kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens, H = 2048 / d,
   bf16), the settings in turn each round; medians, TFLOP/s, each ratio to the first setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forward_check import forward_verdict  # noqa: E402
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


def _forward(q, k, v, causal: bool):
    """(out, lse) of hopper.forward, the dense Gluon forward as auto configures it."""
    from flashtile.kernels import hopper

    out = torch.empty_like(q)
    return out, hopper.forward(q, k, v, out, q.shape[-1] ** -0.5, causal)


def check_and_time(switch: str, args: argparse.Namespace, which: str = "bwd") -> None:
    """Steps 1 and 2 of this module's docstring for the environment variable ``switch``: ``which``
    "bwd", the fused kernel forced (FLASHTILE_GLUON_BWD_FUSED=1), or "fwd"."""
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    shapes = ((1000, 1100), (203, 203), (900, 333))  # (q longer: rows that see no key)
    for setting in args.settings:
        os.environ[switch] = setting
        for head_dim in args.headdims:
            if which == "fwd":
                # (and one of more Q tiles than the H200 has SMs, 1152 at d64, so that persistent
                # programs each take several)
                cases = [(2, sq, sk, 6, 2, causal) for sq, sk in shapes for causal in (False, True)]
                cases += [(2, 1000, 1000, 96, 32, causal) for causal in (False, True)]
                verdict = forward_verdict(_forward, cases, head_dim)
                if verdict != "ok":
                    raise SystemExit(f"{switch}={setting}, d{head_dim}: {verdict}")
                continue
            for causal in (False, True):
                for seqlen_q, seqlen_k in shapes:
                    check(head_dim, causal, seqlen_q, seqlen_k)
        what = "O and LSE" if which == "fwd" else "gradients"
        print(f"{switch}={setting}: {what} within the oracle's tolerance (d{args.headdims}, causal and not)",
              flush=True)
    name = "forward" if which == "fwd" else "backward"
    print(f"\n{name} TFLOP/s by {switch}, kernels alone (CUDA graphs), medians of {args.rounds} rounds")
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
