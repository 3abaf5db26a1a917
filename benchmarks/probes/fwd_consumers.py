"""The d64 Gluon forward on three or four consumer warpgroups against two (attempts 48, 60, 69): checked, then timed.

    python benchmarks/probes/fwd_consumers.py [--seqlens 1024 4096 16384] [--rounds 3] [--four]

FLASHTILE_GLUON_FWD_CONSUMERS=3 runs gluon_fwd._fwd_pingpong_kernel at kernel head dim 64 with
three 64-row consumer warpgroups (192-row Q tiles), as FlashAttention-3's d64 forward does;
written in session 19; session 20 ran this probe (0.91-0.98x two consumers with 64-key tiles,
0.56-0.61x with 128-key ones, which spilled; benchmarks/results/2026-12-01-h200-session20).
Session 23 added each tile's two products in turn (``OVERLAP`` off, hopper.FORWARD_OVERLAP):
128-key tiles then compile without a spill (attempt 60). Session 28 added four consumers
(256-row tiles, which divide 1k, 4k and 16k; 64-key tiles within 112 registers a thread):
``--four`` times them against auto's three. On an H200:

1. each variant that is not the default against the float64 oracle (odd lengths, q != k, GQA,
   causal and not): the largest error and the tolerance rule's bound (flashtile.testing);
2. the forward alone, CUDA graphs of ``hopper.forward`` (no host time), B·N = 16k tokens and
   H = 2048 / 64 = 32 heads, bf16, causal and not: two consumers as under ``auto`` and the
   VARIANTS (consumers; for three, BLOCK_N, stages and a worker consumer's registers, the default
   partition getting 8 more; the products overlapped or in turn), each the median of
   ``--rounds`` interleaved rounds. TFLOP/s = 4·B·H·N²·d / t, halved when causal.

Prints a table of TFLOP/s and each variant over two consumers.
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

# (consumers, (BLOCK_N, NUM_STAGES, consumer registers) of three or four, or None, products overlapped)
VARIANTS = [(2, None, False), (3, (64, 3, 160), True), (3, (128, 2, 160), False), (3, (128, 3, 160), False),
            (3, (128, 2, 160), True)]
# --four: auto's three against four consumers of 64-key tiles in 2, 3 and 4 stages
FOUR_VARIANTS = [(3, (128, 2, 160), False), (4, (64, 2, 112), False), (4, (64, 3, 112), False),
                 (4, (64, 4, 112), False)]
_COUNTS = {2: "two", 3: "three", 4: "four"}


def variant_name(variant) -> str:
    consumers, tiles, overlap = variant
    return f"{_COUNTS[consumers]}{'' if tiles is None else ' ' + str(tiles)}" + (" overlap" if overlap else " in turn")


def run_forward(q, k, v, causal: bool, variant=None):
    """hopper.forward on (B, H, S, D) tensors as ``variant`` says (None: two consumers as under
    auto); returns (out, lse)."""
    out = torch.empty_like(q)
    with _variant(variant):
        lse = hopper.forward(q, k, v, out, q.shape[-1] ** -0.5, causal)
    return out, lse


class _variant:
    """FLASHTILE_GLUON_FWD_CONSUMERS, the three- or four-consumer tiles and registers and the order
    of the products (hopper.FORWARD_OVERLAP) of a VARIANTS entry, for a block (None: two consumers,
    the products overlapped)."""

    def __init__(self, variant):
        self.variant = (2, None, True) if variant is None else variant

    def __enter__(self):
        self.saved = (os.environ.get(hopper.FORWARD_CONSUMERS_SWITCH), hopper.FORWARD_THREE_CONSUMER_TILES,
                      hopper.FORWARD_FOUR_CONSUMER_TILES, dict(hopper.FORWARD_CONSUMER_REGS),
                      dict(hopper.FORWARD_OVERLAP))
        consumers, tiles, overlap = self.variant
        os.environ[hopper.FORWARD_CONSUMERS_SWITCH] = str(consumers)
        if tiles is not None:
            block_n, stages, regs = tiles
            if consumers == 3:
                hopper.FORWARD_THREE_CONSUMER_TILES = (block_n, stages)
            else:
                hopper.FORWARD_FOUR_CONSUMER_TILES = (block_n, stages)
            hopper.FORWARD_CONSUMER_REGS[consumers] = regs
        hopper.FORWARD_OVERLAP[consumers] = overlap

    def __exit__(self, *exc):
        switch, three, four, regs, overlap = self.saved
        if switch is None:
            os.environ.pop(hopper.FORWARD_CONSUMERS_SWITCH, None)
        else:
            os.environ[hopper.FORWARD_CONSUMERS_SWITCH] = switch
        hopper.FORWARD_THREE_CONSUMER_TILES, hopper.FORWARD_FOUR_CONSUMER_TILES = three, four
        for table, saved in ((hopper.FORWARD_CONSUMER_REGS, regs), (hopper.FORWARD_OVERLAP, overlap)):
            table.clear()
            table.update(saved)


def check(variant) -> str:
    """The variant against the oracle on small odd problems; 'ok' or what failed."""
    cases = [(2, 17, 17, 4, 4, False), (1, 113, 203, 8, 2, True), (1, 203, 113, 8, 1, False),
             (1, 1000, 1000, 4, 2, True), (1, 1, 1023, 4, 4, True), (1, 4097, 1024, 2, 1, True)]
    return forward_verdict(lambda q, k, v, causal: run_forward(q, k, v, causal, variant), cases, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--four", action="store_true", help="auto's three consumers against four")
    args = parser.parse_args()
    variants = FOUR_VARIANTS if args.four else VARIANTS
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for variant in variants:
        try:
            verdict = check(variant)
        except Exception as error:  # noqa: BLE001 - a variant that does not build: report, go on
            verdict = f"ERROR {type(error).__name__}: {str(error).splitlines()[0][:100]}"
        print(f"{variant_name(variant)} (BLOCK_N, stages, registers) against the oracle: {verdict}",
              flush=True)
    names = ["two"] + [variant_name(v) for v in variants]
    print(f"\nforward TFLOP/s, CUDA graphs, d64, 16k tokens, 32 heads, bf16; median of {args.rounds} rounds")
    print(f"{'causal':>6} {'N':>6} | " + " | ".join(f"{name:>28}" for name in names))
    for causal in (False, True):
        for seqlen in args.seqlens:
            batch, heads = max(16384 // seqlen, 1), 32
            q, k, v = (torch.randn(batch, heads, seqlen, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * batch * heads * seqlen * seqlen * 64 / (2 if causal else 1)
            times = {name: [] for name in names}
            for _ in range(args.rounds):
                for name, variant in [("two", None)] + [(variant_name(v), v) for v in variants]:
                    try:
                        with _variant(variant):
                            out = torch.empty_like(q)
                            times[name].append(graph_ms(
                                lambda: hopper.forward(q, k, v, out, 0.125, causal)))
                    except Exception as error:  # noqa: BLE001 - a variant that does not build: report, go on
                        times[name].append(float("nan"))
                        print(f"  {name}: {type(error).__name__}: {str(error).splitlines()[0][:100]}", flush=True)
            # (a variant that failed in any round reads nan)
            rates = {name: flops / statistics.median(t) * 1e-9 if all(x == x for x in t) else float("nan")
                     for name, t in times.items()}
            cells = [f"{rates['two']:28.0f}"] + [f"{rates[n]:18.0f} ({rates[n] / rates['two']:5.2f}x) "
                                                  for n in names[1:]]
            print(f"{'yes' if causal else 'no':>6} {seqlen:>6} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
