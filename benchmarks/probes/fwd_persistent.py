"""The dense Gluon forward on persistent programs against a program per Q tile (attempt 61): checked, then timed.

    python benchmarks/probes/fwd_persistent.py [--headdims 64 128 256] [--seqlens 1024 4096 16384] [--rounds 3]

FLASHTILE_GLUON_FWD_PERSISTENT=1 launches gluon_fwd._fwd_pingpong_kernel with PERSISTENT: one
program per SM, each taking Q tiles pid, pid + programs, ...; the loader streams the next tile's
K/V round the same ring (and its Q into a second buffer, where shared memory holds one) while the
consumers finish this tile. A program per Q tile pays the CTA's start, Q's load and the ring's
filling per tile: with 8 K/V tiles a Q tile (1k keys) that is a larger share than with 128. On an
H200:

1. persistent programs (each variant below) against the float64
   oracle at each head dim (odd lengths, q != k, GQA, causal and not, more tiles than
   programs): the largest error and the tolerance rule's bound;
2. the forward alone, CUDA graphs of ``hopper.forward`` (no host time), B·N = 16k tokens and
   H = 2048 / d heads, bf16, causal and not (``--causal``): a program per tile against persistent
   programs in fixed turns and on the dynamic scheduler (hopper.PERSISTENT_DYNAMIC, attempt 63:
   each tile the next of a counter shared by the grid), and on it with the next tile's first K/V
   tiles copied before the wait for this one's output where there is one Q buffer
   (hopper.PERSISTENT_EARLY_KV, attempt 64: d256, d128 in 3 stages; elsewhere the same launch
   as "dynamic"), the consumers as under auto, each the
   median of ``--rounds`` interleaved rounds. (Session 24 also timed snake turns, attempt 62:
   benchmarks/results/2026-12-01-h200-session24/fwd-snake.log; removed since.)
   TFLOP/s = 4·B·H·N²·d / t, halved when causal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from flashtile.kernels import hopper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import graph_ms  # noqa: E402

from forward_check import forward_verdict  # noqa: E402 (beside this file)


# The launches timed: a program per Q tile, persistent programs in fixed turns, on the dynamic
# scheduler (hopper.PERSISTENT_DYNAMIC, attempt 63), and on it with the next tile's first K/V tiles
# copied early where there is one Q buffer (hopper.PERSISTENT_EARLY_KV, attempt 64): (switch,
# dynamic, early K/V).
VARIANTS = {"per tile": ("0", False, False), "persistent": ("1", False, False), "dynamic": ("1", True, False),
            "dynamic early kv": ("1", True, True)}


class _persistent:
    """FLASHTILE_GLUON_FWD_PERSISTENT, hopper.PERSISTENT_DYNAMIC and hopper.PERSISTENT_EARLY_KV as
    VARIANTS[``name``] says, for a block."""

    def __init__(self, name: str):
        self.value, self.dynamic, self.early = VARIANTS[name]

    def __enter__(self):
        self.saved = (os.environ.get(hopper.FORWARD_PERSISTENT_SWITCH), hopper.PERSISTENT_DYNAMIC,
                      hopper.PERSISTENT_EARLY_KV)
        os.environ[hopper.FORWARD_PERSISTENT_SWITCH] = self.value
        hopper.PERSISTENT_DYNAMIC, hopper.PERSISTENT_EARLY_KV = self.dynamic, self.early

    def __exit__(self, *exc):
        switch, hopper.PERSISTENT_DYNAMIC, hopper.PERSISTENT_EARLY_KV = self.saved
        if switch is None:
            os.environ.pop(hopper.FORWARD_PERSISTENT_SWITCH, None)
        else:
            os.environ[hopper.FORWARD_PERSISTENT_SWITCH] = switch


def check(head_dim: int, variant: str) -> str:
    """Persistent programs (``variant``: a VARIANTS name) against the oracle on odd problems at
    ``head_dim``; 'ok' or what failed."""
    cases = [(2, 17, 17, 4, 4, False), (1, 113, 203, 8, 2, True), (1, 203, 113, 8, 1, False),
             (3, 1000, 1000, 16, 2, True), (1, 1, 1023, 4, 4, True), (2, 4097, 1024, 8, 1, True),
             (4, 2048, 2048, 32, 8, False)]

    def forward(q, k, v, causal):
        out = torch.empty_like(q)
        with _persistent(variant):
            return out, hopper.forward(q, k, v, out, head_dim ** -0.5, causal)

    return forward_verdict(forward, cases, head_dim)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    args = parser.parse_args()
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    sms = hopper.sm_count(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {sms} SMs")
    for head_dim in args.headdims:
        for variant in (name for name in VARIANTS if name != "per tile"):
            try:
                verdict = check(head_dim, variant)
            except Exception as error:  # noqa: BLE001 - a kernel that does not build: report, go on
                verdict = f"ERROR {type(error).__name__}: {str(error).splitlines()[0][:100]}"
            print(f"{variant} d{head_dim} against the oracle: {verdict}", flush=True)
    print(f"\nforward TFLOP/s, CUDA graphs, 16k tokens, 2048 / d heads, bf16; median of {args.rounds} rounds")
    print(f"{'d':>4} {'causal':>6} {'N':>6} | {'per tile':>9} | " +
          " | ".join(f"{name:>18}" for name in VARIANTS if name != "per tile"))
    for head_dim in args.headdims:
        for causal in causals:
            for seqlen in args.seqlens:
                batch, heads = max(16384 // seqlen, 1), 2048 // head_dim
                q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                out = torch.empty_like(q)
                flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                times = {name: [] for name in VARIANTS}
                for _ in range(args.rounds):
                    for name in times:
                        try:
                            with _persistent(name):
                                times[name].append(graph_ms(
                                    lambda: hopper.forward(q, k, v, out, head_dim ** -0.5, causal)))
                        except Exception as error:  # noqa: BLE001 - a kernel that does not build: report, go on
                            times[name].append(float("nan"))
                            print(f"  {name}: {type(error).__name__}: {str(error).splitlines()[0][:100]}",
                                  flush=True)
                # (a kernel that failed in any round reads nan)
                rates = {name: flops / statistics.median(t) * 1e-9 if all(x == x for x in t) else float("nan")
                         for name, t in times.items()}
                base = rates["per tile"]
                cells = [f"{rates[name]:9.0f} ({rates[name] / base:5.2f}x)" for name in VARIANTS if name != "per tile"]
                print(f"{head_dim:>4} {'yes' if causal else 'no':>6} {seqlen:>6} | {base:9.0f} | " + " | ".join(cells),
                      flush=True)


if __name__ == "__main__":
    main()
