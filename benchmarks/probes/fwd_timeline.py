"""The d64 forward's consumers on a timeline: where a persistent program's time per work item goes.

    python benchmarks/probes/fwd_timeline.py [--seqlens 1024 4096] [--causal]

Session 27's grid read the d64 non-causal forward at 434 TFLOP/s at 1k keys, 490 at 4k and 506 at
16k. Fitted as time = a + b · tiles per Q tile (8, 32, 128 K/V tiles of 128 keys), each Q tile
(work item) costs ~1.4 tiles' time more than its tiles: ~15% of the 1k forward. This probe asks the
kernel where that goes. It launches the d64 forward on persistent programs (three consumers, tiles
in turn, two Q buffers, as auto runs it up to 4k keys; at 16k auto runs a program per tile) with a
Trace buffer: gluon_fwd's consumers then stamp the SM's clock64 at each step
(gluon_fwd.TRACE_EVENTS) for the first TRACE_ITEMS items of the first TRACE_PROGRAMS programs.
Printed, in clocks:

- a tile's period (one consumer's P V done to its next), the S product (K ready to S done), the
  softmax (S done to P ready) and the P V product (P ready to P V done, the V wait included);
- an item's transition: its last P V done to the next item's first (against a tile's period),
  split into the epilogue (its start to its end: O scaled, stored, the store waited for), the
  wait for the next Q, and the next item's first K wait and S;
- the transition step by step, between the stamps (the epilogue's three, the next item's first);
- the consumers' stagger: how far apart the three consumers finish the same tile;
- item to item, for items whose parts all see keys and for those with a part that sees none;
- the kernel's time with and without the stamps (CUDA graphs), to show what they cost.

The stamps are global stores, and the fences and barrier arrivals after them wait for them: read
the epilogue's steps (its fence) and the next item's start (the Q buffer's release) as upper
bounds. Read non-causal runs: under --causal the items' tiles differ in count, so the last slot
holds a different tile per consumer (its stagger compares different tiles), items of fewer than
TRACE_TILES live tiles drop out of the transition, and past 1k keys the dynamic scheduler waits
for Q before stamp 0 (gluon_fwd.TRACE_EVENTS).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import graph_ms  # noqa: E402

from flashtile.kernels import hopper  # noqa: E402


def launch(q, k, v, out, causal: bool, trace=None):
    """The persistent d64 forward as hopper.forward launches it, with ``trace`` as its Trace."""
    gluon_fwd = hopper._gluon()[0]
    head_dim = q.shape[-1]
    scale = head_dim ** -0.5
    plan = hopper._dense_forward_plan(q, k, v, out, scale, causal, head_dim, hopper.forward_consumers(head_dim),
                                      hopper.sm_count(q.device))
    descriptors = [hopper._bound(template, t) for template, t in zip(plan.templates, (q, k, v, out))]
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if plan.dynamic else None
    gluon_fwd._fwd_pingpong_kernel[plan.grid](*descriptors, lse, *plan.scalars, counter, Trace=trace,
                                              **plan.constexprs)
    return plan


def summarise(stamps: torch.Tensor, n_tiles: int, tiles_traced: int) -> None:
    """Print the module docstring's readings from ``stamps`` (programs, items, consumers, events)."""
    events = stamps.shape[-1]
    programs, items, consumers = stamps.shape[:3]
    tiles = min(n_tiles, tiles_traced)  # slots; the last holds the item's last tile
    last = tiles - 1

    def at(p, i, c, e):
        return int(stamps[p, i, c, e])

    def pv_done(p, i, c, j):
        return at(p, i, c, 5 + 4 * j)

    period, s_product, softmax, pv_product, stagger = [], [], [], [], []
    transition, epilogue, q_wait, first_s = [], [], [], []
    for p in range(programs):
        for i in range(items):
            for c in range(consumers):
                if at(p, i, c, 1) == 0:  # an item this program did not reach
                    continue
                for j in range(tiles):
                    if not all(at(p, i, c, e + 4 * j) for e in (2, 3, 4, 5)):  # (a tile the part skipped)
                        continue
                    s_product.append(at(p, i, c, 3 + 4 * j) - at(p, i, c, 2 + 4 * j))
                    softmax.append(at(p, i, c, 4 + 4 * j) - at(p, i, c, 3 + 4 * j))
                    pv_product.append(pv_done(p, i, c, j) - at(p, i, c, 4 + 4 * j))
                    if j and pv_done(p, i, c, j - 1) and (j < last or n_tiles == tiles):  # (slot `last`: the last tile)
                        period.append(pv_done(p, i, c, j) - pv_done(p, i, c, j - 1))
                epilogue.append(at(p, i, c, events - 1) - at(p, i, c, events - 4))
                if i + 1 < items and at(p, i + 1, c, 1) and pv_done(p, i, c, last) and pv_done(p, i + 1, c, 0):
                    transition.append(pv_done(p, i + 1, c, 0) - pv_done(p, i, c, last))
                    q_wait.append(at(p, i + 1, c, 1) - at(p, i + 1, c, 0))
                    first_s.append(at(p, i + 1, c, 3) - at(p, i + 1, c, 1))
            for j in range(tiles):
                done = [pv_done(p, i, c, j) for c in range(consumers) if at(p, i, c, 1) and pv_done(p, i, c, j)]
                if len(done) == consumers:
                    stagger.append(max(done) - min(done))

    def line(name, values):
        if values:
            print(f"  {name:44s} median {statistics.median(values):7.0f}  min {min(values):7d}  "
                  f"max {max(values):7d}  (n={len(values)})")

    # Item to item (the first consumer's Q ready to its next), items whose parts all see keys apart
    # from those with a part that sees none (e.g. the last Q tile of a length 192 rows do not
    # divide; in fixed turns a program of 1k keys takes only such items or none of them).
    whole, short = [], []
    for p in range(programs):
        for i in range(items - 1):
            if at(p, i, 0, 1) and at(p, i + 1, 0, 1):
                live = all(pv_done(p, i, c, 0) for c in range(consumers))
                (whole if live else short).append(at(p, i + 1, 0, 1) - at(p, i, 0, 1))
    line("item to item, every part live", whole)
    line("item to item, a part without keys", short)
    line("tile period (P V done to P V done)", period)
    line("S product (K ready to S done)", s_product)
    line("softmax (S done to P ready)", softmax)
    line("P V product (P ready to P V done)", pv_product)
    line("consumers' stagger on a tile", stagger)
    line("epilogue (start to the store's wait done)", epilogue)
    line("item transition (last P V to next first)", transition)
    line("  of it: the wait for the next Q", q_wait)
    line("  of it: Q ready to the first S done", first_s)
    # The transition step by step: the item's last P V done, its epilogue's stamps, the next item's
    # start (before and after its Q wait), its first K ready and S done.
    steps = ["last P V done", "epilogue start", "O staged", "store issued", "epilogue end", "next: before Q wait",
             "next: Q ready", "next: K ready", "next: S done"]
    gaps = {name: [] for name in steps[1:]}
    for p in range(programs):
        for i in range(items - 1):
            for c in range(consumers):
                if not (at(p, i, c, 1) and at(p, i + 1, c, 1)):
                    continue
                times = [pv_done(p, i, c, last), *(at(p, i, c, events - k) for k in (4, 3, 2, 1)),
                         at(p, i + 1, c, 0), at(p, i + 1, c, 1), at(p, i + 1, c, 2), at(p, i + 1, c, 3)]
                if all(times):  # (a part wholly outside the sequence stores nothing: no O-staged or store stamps)
                    for name, before, after in zip(steps[1:], times, times[1:]):
                        gaps[name].append(after - before)
    for name in steps[1:]:
        line(f"    to {name}", gaps[name])
    if transition and period:
        extra = statistics.median(transition) - statistics.median(period)
        print(f"  an item costs {extra:.0f} clocks past its tiles' periods: {extra / statistics.median(period):.2f} "
              f"tile periods, against {n_tiles} tiles an item")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--save", metavar="DIR", help="also save each length's stamps there (torch.save)")
    args = parser.parse_args()
    gluon_fwd = hopper._gluon()[0]
    head_dim = 64
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for n in args.seqlens:
        batch, heads = 16384 // n, 2048 // head_dim
        q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        plan = launch(q, k, v, out, args.causal)
        consumers = plan.constexprs.get("CONSUMERS", 2)
        shape = (int(gluon_fwd.TRACE_PROGRAMS), int(gluon_fwd.TRACE_ITEMS), consumers, int(gluon_fwd.TRACE_EVENTS))
        trace = torch.zeros(shape, dtype=torch.int64, device="cuda")
        plain = graph_ms(lambda: launch(q, k, v, out, args.causal))
        traced = graph_ms(lambda: launch(q, k, v, out, args.causal, trace))
        trace.zero_()
        launch(q, k, v, out, args.causal, trace)
        torch.cuda.synchronize()
        expected = torch.empty_like(out)
        hopper.forward(q, k, v, expected, head_dim ** -0.5, args.causal)
        assert torch.equal(out, expected), "the traced launch's output differs from hopper.forward's"
        block_n = plan.constexprs["BLOCK_N"]
        flops = 4 * batch * heads * n * n * head_dim / (2 if args.causal else 1)
        print(f"\nd{head_dim} {'causal' if args.causal else 'non-causal'} N={n}: {plan.grid[0]} programs, "
              f"{consumers} consumers, {block_n}-key tiles ({n // block_n} an item), kernel "
              f"{flops / plain * 1e-9:.0f} TFLOP/s plain, {flops / traced * 1e-9:.0f} traced (CUDA graphs)")
        summarise(trace.cpu(), -(-n // block_n), int(gluon_fwd.TRACE_TILES))
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            name = f"stamps-d{head_dim}-{n}{'-causal' if args.causal else ''}.pt"
            torch.save(trace.cpu(), os.path.join(args.save, name))


if __name__ == "__main__":
    main()
