"""The document-mask cells against FlexAttention, timed in alternating rounds.

    python benchmarks/probes/documents_vs_flex.py [--docs 16] [--rounds 5] [--seqlen 16384]

Session 19 timed the 16-document cell (N = 16k, d128, 16 heads, bf16, causal documents) two ways
in one device call and they disagreed: ``flashtile bench --scenario document`` (backward alone,
``retain_graph``, as flash-attn's and Flex's own benchmarks time it) had flashtile ahead of Flex
in forward, backward and the whole step, while ``masks.py`` (backward = step − forward) had its
backward 0.84× Flex's. The cell is host-bound (its kernels take ~0.76 ms of a ~1.05 ms eager
step, probes/step_timeline.py), so one timing of each, minutes apart, mostly measures the host's
mood. Here both libraries are timed in turn, ``--rounds`` times, in both layouts, each round
giving every measure: forward, backward alone (retain_graph), the whole step (forward +
``torch.autograd.grad``) and masks.py's step − forward. Printed: each round's ms, then the
median over rounds and flex / flashtile (> 1: flashtile faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from masks import causal_documents, flex_fn, time_fwd_bwd  # noqa: E402

MEASURES = ("fwd", "bwd alone", "step", "step - fwd")


def measures(fn, q, k, v) -> dict:
    """ms of each of MEASURES for ``fn(q, k, v)`` (masks.py's three, and masks.py's old backward)."""
    fwd, alone, step = time_fwd_bwd(fn, q, k, v, warmup=10, rep=60)
    return {"fwd": fwd, "bwd alone": alone, "step": step, "step - fwd": step - fwd}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n, heads, d, device = args.seqlen, 16, 128, torch.device("cuda")
    ids, mask, block_mask = causal_documents(n, args.docs, device)
    # takes and returns (B, S, H, D), as masks.py's; with Flex's donated buffers off (retain_graph)
    flex = flex_fn(ids, True, 1, heads, n, device)
    providers = {
        "flashtile bshd": (lambda q, k, v: flashtile.attention(q, k, v, mask_mod=mask, block_mask=block_mask), "bshd"),
        "flex bshd": (flex, "bshd"),
        "flashtile bhsd": (lambda q, k, v: flashtile.attention(q, k, v, mask_mod=mask, block_mask=block_mask,
                                                               layout="bhsd"), "bhsd"),
        # Flex's own layout: no transposes around the compiled call
        "flex bhsd": (lambda q, k, v: flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2),
                      "bhsd"),
    }
    inputs = {}
    for layout in ("bshd", "bhsd"):
        shape = (1, n, heads, d) if layout == "bshd" else (1, heads, n, d)
        inputs[layout] = [torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
                          for _ in range(3)]
    times = {name: {m: [] for m in MEASURES} for name in providers}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; N={n}, {args.docs} causal documents, d{d}, "
          f"{heads} heads, bf16; ms per call, do_bench medians; rounds alternate the providers")
    for round_ in range(args.rounds):
        for name, (fn, layout) in providers.items():
            got = measures(fn, *inputs[layout])
            for m in MEASURES:
                times[name][m].append(got[m])
            print(f"round {round_ + 1} {name:15s} " + "  ".join(f"{m} {got[m]:.3f}" for m in MEASURES), flush=True)
    print(f"\nmedian of {args.rounds} rounds (flex / flashtile: > 1, flashtile faster)")
    print(f"{'':16s}" + "".join(f"{m:>14s}" for m in MEASURES))
    for layout in ("bshd", "bhsd"):
        ours, theirs = (times[f"{who} {layout}"] for who in ("flashtile", "flex"))
        for who, row in (("flashtile", ours), ("flex", theirs)):
            print(f"{who + ' ' + layout:16s}" + "".join(f"{statistics.median(row[m]):14.3f}" for m in MEASURES))
        print(f"{'  ratio':16s}" + "".join(
            f"{statistics.median(theirs[m]) / statistics.median(ours[m]):14.2f}" for m in MEASURES))


if __name__ == "__main__":
    main()
