"""An A/B of a backward switch in one process: each setting of an environment variable that
flashtile reads per call, cell by cell, in alternating rounds.

    python benchmarks/probes/backward_ab.py [--switch FLASHTILE_GLUON_DQ_STATS] [--values 0 1]
        [--cells 128c4096 ...] [--docs 16 4] [--rounds 3]

Cells follow the speed table's convention (16k tokens, hidden 2048, bf16): "128c4096" is d128,
causal, N = 4096; "128n1024" non-causal. ``--docs D`` adds d128, N = 16k under a causal document
mask of D documents (masks.py's row, one block mask built up front). For each cell and setting,
the median over rounds of

- ``graph bwd``: a captured forward + backward less a captured forward (the kernels alone),
- ``eager step``: ``torch.autograd.grad(attention(q, k, v), ...)`` called eagerly, as masks.py
  times it (host time in: on a host-bound step, the host's time),
- ``eager fwd``: the forward alone, eagerly, without grad.

Before timing, each setting's gradients are compared with the first setting's (within 1% of
the largest: the settings may sum in another order, and bf16 rounds the result). Last, a table
of each setting's times over the first's. Eager calls (the check, the eager timings) run on a
side stream, the eager timings after every capture of the cell: PyTorch's autograd keeps the
stream of the call that made a node, and a capture after an eager backward on the default
stream failed in session 16 (cudaErrorStreamCaptureImplicit; pytorch/pytorch#164302).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

import torch
from triton.testing import do_bench

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import graph_ms  # noqa: E402  (a CUDA graph's replay, warmed up on a side stream)
from masks import causal_documents  # noqa: E402


def make_cell(spec: str):
    """(q, k, v, dout, attention options) of a cell name: "128c4096" or "docs16"."""
    if spec.startswith("docs"):
        docs, head_dim, seqlen, causal = int(spec[4:]), 128, 16384, None
    else:  # head dim, c(ausal) or n(ot), N
        letter = next(i for i, char in enumerate(spec) if char.isalpha())
        head_dim, causal, seqlen = int(spec[:letter]), spec[letter] == "c", int(spec[letter + 1:])
    heads, batch = 2048 // head_dim, 16384 // seqlen
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    if causal is None:
        _, mask, block_mask = causal_documents(seqlen, docs, "cuda")
        options = {"mask_mod": mask, "block_mask": block_mask}
    else:
        options = {"causal": causal}
    return q, k, v, torch.randn_like(q), options


def run_cell(spec: str, args, results) -> None:
    """Check, then time, every setting of ``args.switch`` on one cell; print its medians."""
    q, k, v, dout, options = make_cell(spec)

    def forward():
        with torch.no_grad():
            return flashtile.attention(q, k, v, **options)

    def step():
        return torch.autograd.grad(flashtile.attention(q, k, v, **options), (q, k, v), dout)

    reference = None
    side = torch.cuda.Stream()  # eager work before a capture goes on a side stream (see the docstring)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for value in args.values:  # correctness first, and every kernel built before timing
            os.environ[args.switch] = value
            grads = step()
            if reference is None:
                reference = grads
            for name, got, want in zip("qkv", grads, reference):
                error = (got.float() - want.float()).abs().max().item()
                scale = want.float().abs().max().item()
                if error > 1e-2 * max(scale, 1.0):
                    raise SystemExit(f"{spec} {args.switch}={value}: d{name} differs from "
                                     f"{args.switch}={args.values[0]}'s by {error:.3g} (max |d{name}| {scale:.3g})")
    torch.cuda.current_stream().wait_stream(side)
    graphs, eager = collections.defaultdict(list), collections.defaultdict(list)
    for _ in range(args.rounds):  # every capture before any eager call on the default stream
        for value in args.values:
            os.environ[args.switch] = value
            graphs[value].append(graph_ms(step) - graph_ms(forward))
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (do_bench times on the current stream)
        for _ in range(args.rounds):
            for value in args.values:
                os.environ[args.switch] = value
                eager[value].append((do_bench(step, warmup=10, rep=100), do_bench(forward, warmup=10, rep=100)))
    torch.cuda.current_stream().wait_stream(side)
    for value in args.values:
        results[spec, value] = [(g, *e) for g, e in zip(graphs[value], eager[value])]
    line = "  ".join(f"{value}: " + " / ".join(f"{statistics.median(t):.3f}" for t in zip(*results[spec, value]))
                     for value in args.values)
    print(f"{spec:10s} {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", default="FLASHTILE_GLUON_DQ_STATS")
    parser.add_argument("--values", nargs="+", default=["0", "1"])
    parser.add_argument("--cells", nargs="*", default=["64c1024", "64n16384", "128c1024", "128n1024", "128c4096",
                                                         "128n16384", "128c16384", "256c1024", "256n16384"])
    parser.add_argument("--docs", type=int, nargs="*", default=[16, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cells = [*args.cells, *(f"docs{d}" for d in args.docs)]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.switch} in {args.values}; "
          f"ms, median of {args.rounds} rounds: graph bwd / eager step / eager fwd", flush=True)
    results = collections.defaultdict(list)  # (cell, value) -> [(graph bwd, eager step, eager fwd)]
    for spec in cells:
        run_cell(spec, args, results)
    base = args.values[0]
    print(f"\ntime / {args.switch}={base}'s: graph bwd, eager step, eager fwd")
    for spec in cells:
        medians = {value: [statistics.median(t) for t in zip(*results[spec, value])] for value in args.values}
        print(f"{spec:10s} " + "  ".join(
            f"{value}: " + " ".join(f"{m / b:.3f}" for m, b in zip(medians[value], medians[base]))
            for value in args.values[1:]))


if __name__ == "__main__":
    main()
