"""The Hopper forward of two source trees, as ``auto`` runs it, timed in turn: kernels alone.

    python benchmarks/probes/fwd_tree_ab.py --trees OLD/src NEW/src [--headdims 64] [--seqlens 1024 4096 16384]
                                           [--causal both] [--rounds 3]

For a kernel change with no switch of its own (session 26: the consumers of a d64 Q tile skip the
K/V tiles none of their rows sees), the only A/B is the tree before against the tree after. Each
round runs one process per tree, the trees alternating (``--trees``' order), each process timing
``hopper.forward`` with the module's settings as found (what ``auto`` chooses: consumers,
persistent programs, the scheduler) as CUDA graphs (no host time) on B·N = 16k tokens, H = 2048 / d
heads, bf16, the same seeded inputs in both trees. Prints each cell's median over the rounds in
TFLOP/s (4·B·H·N²·d / t, halved when causal) per tree and the last tree's ratio over the first.
Correctness is the GPU tests' job; this only times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def time_cells(headdims: list, seqlens: list, causals: list) -> None:
    """One line of JSON per cell: the median ms of the forward as a CUDA graph, in this process's tree."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from timing import graph_ms

    from flashtile.kernels import hopper

    for head_dim in headdims:
        for causal in causals:
            for seqlen in seqlens:
                batch, heads = max(16384 // seqlen, 1), 2048 // head_dim
                generator = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
                q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                                       generator=generator) for _ in range(3))
                out = torch.empty_like(q)
                ms = graph_ms(lambda: hopper.forward(q, k, v, out, head_dim ** -0.5, causal))
                flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                print(json.dumps({"d": head_dim, "causal": causal, "n": seqlen, "ms": ms, "flops": flops}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", help="src/ directories, timed in this order each round")
    parser.add_argument("--headdims", type=int, nargs="+", default=[64])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    if args.child:
        time_cells(args.headdims, args.seqlens, causals)
        return
    if not args.trees:
        parser.error("--trees: give at least one src/ directory")
    cell_args = ["--headdims", *map(str, args.headdims), "--seqlens", *map(str, args.seqlens), "--causal", args.causal]
    times: dict = {tree: {} for tree in args.trees}
    flops: dict = {}
    for round_ in range(args.rounds):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *cell_args], env=env,
                                 capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                print(f"round {round_ + 1}, {tree}: exit {run.returncode}\n{run.stderr[-2000:]}", flush=True)
                continue
            for line in run.stdout.splitlines():
                if line.startswith("{"):
                    cell = json.loads(line)
                    key = (cell["d"], cell["causal"], cell["n"])
                    times[tree].setdefault(key, []).append(cell["ms"])
                    flops[key] = cell["flops"]
            print(f"round {round_ + 1}, {tree}: done", flush=True)
    first, last = args.trees[0], args.trees[-1]
    print(f"\nforward TFLOP/s, CUDA graphs, median of {args.rounds} rounds; ratio: {last} over {first}")
    names = " | ".join(f"{'tree ' + str(i + 1):>8}" for i in range(len(args.trees)))
    print(f"{'d':>4} {'causal':>6} {'N':>6} | {names} | ratio | rounds (ms; each tree's, in --trees' order)")
    for key in sorted(flops):
        rates = [flops[key] / statistics.median(times[tree][key]) * 1e-9 if times[tree].get(key) else float("nan")
                 for tree in args.trees]
        rounds = " / ".join(" ".join(f"{ms:.4f}" for ms in times[tree].get(key, [])) for tree in args.trees)
        d, causal, n = key
        print(f"{d:>4} {'yes' if causal else 'no':>6} {n:>6} | " + " | ".join(f"{r:8.1f}" for r in rates)
              + f" | {rates[-1] / rates[0]:5.3f} | {rounds}")


if __name__ == "__main__":
    main()
