"""The causal grids' order of (batch, head) rows: groups of heads, heaviest tiles first, against
rows one after the other (an A/B in one process, CUDA graphs, so host time is out).

    python benchmarks/probes/causal_order.py [--headdims 64 128 256] [--seqlens 1024 2048 4096 8192 16384]
        [--budgets 0 8 32 inf] [--rounds 2]

For each budget (MiB of L2 a group's streamed tensors may take, hopper.CAUSAL_L2_BYTES; 0 = rows
one after the other, inf = the whole grid one group) and each cell of the speed table's
convention (16k tokens, hidden 2048, bf16, causal), the median ms of the Gluon forward and of
the backward (a forward and torch.autograd.grad less the forward) replayed from CUDA graphs. Rounds alternate
the budgets. Before timing, each budget's outputs are compared with budget 0's: the order must
not change a single bit (every tile still has one program, and the seven-product backward
writes each gradient element once; the five-product one adds dQ in no fixed order, so it is
compared within tolerance). Last, a table of each budget's time over budget 0's.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
import triton
from triton.testing import do_bench_cudagraph

import flashtile
from flashtile.kernels import hopper


def flops(batch, heads, seqlen, head_dim, backward):
    return 4 * batch * heads * seqlen * seqlen * head_dim * (2.5 if backward else 1.0) / 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--budgets", nargs="+", default=["0", "8", "32", "inf"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"bf16 causal, CUDA-graph medians (ms)")
    budgets = [math.inf if b == "inf" else float(b) for b in args.budgets]
    default_budget = hopper.CAUSAL_L2_BYTES
    results = {}
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            heads, batch = 2048 // head_dim, 16384 // seqlen
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            dout = torch.randn_like(q)

            def set_budget(mib):
                hopper.CAUSAL_L2_BYTES = 2 ** 62 if mib == math.inf else int(mib * 2 ** 20)

            def forward():
                with torch.no_grad():
                    return flashtile.attention(q, k, v, causal=True)

            reference = None
            for mib in budgets:
                set_budget(mib)
                # On a side stream: after an eager backward on the default stream, capturing one
                # in a graph later in the process failed (cudaErrorStreamCaptureImplicit).
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = flashtile.attention(q, k, v, causal=True)
                    got = (out, *torch.autograd.grad(out, (q, k, v), dout))
                torch.cuda.current_stream().wait_stream(side)
                if reference is None:
                    reference = got
                else:
                    same = all(torch.equal(a, b) for a, b in zip(got, reference))
                    close = all(torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2)
                                for a, b in zip(got, reference))
                    print(f"d{head_dim} N={seqlen} budget {mib} MiB: "
                          f"{'same bits' if same else 'close' if close else 'DIFFERENT'} as budget {budgets[0]}")
            def step():
                out = flashtile.attention(q, k, v, causal=True)
                return torch.autograd.grad(out, (q, k, v), dout)

            times = {(mib, name): [] for mib in budgets for name in ("fwd", "bwd")}
            for _ in range(args.rounds):
                for mib in budgets:
                    set_budget(mib)
                    # the backward as a step's time less the forward's: a graph captures the
                    # backward on the stream its forward ran on, so both go in one capture
                    fwd = do_bench_cudagraph(forward, rep=30, return_mode="median")
                    times[(mib, "fwd")].append(fwd)
                    times[(mib, "bwd")].append(do_bench_cudagraph(step, rep=30, return_mode="median") - fwd)
            for name in ("fwd", "bwd"):
                base = statistics.median(times[(budgets[0], name)])
                cells = []
                for mib in budgets:
                    ms = statistics.median(times[(mib, name)])
                    results[(head_dim, seqlen, name, mib)] = ms
                    tflops = flops(batch, heads, seqlen, head_dim, name == "bwd") / ms * 1e-9
                    cells.append(f"{mib:>4} MiB {ms:7.3f} ms {tflops:4.0f} TF/s {ms / base:5.3f}")
                print(f"d{head_dim:<3} N={seqlen:<5} {name} | " + " | ".join(cells), flush=True)
    hopper.CAUSAL_L2_BYTES = default_budget
    print("\ntime over budget 0 (rows one after the other); < 1: the grouped order is faster")
    print(f"{'cell':18s} " + " ".join(f"{str(mib):>6}" for mib in budgets))
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            for name in ("fwd", "bwd"):
                base = results[(head_dim, seqlen, name, budgets[0])]
                print(f"d{head_dim:<3} {seqlen:>5} {name:4s}   " + " ".join(
                    f"{results[(head_dim, seqlen, name, mib)] / base:6.3f}" for mib in budgets))


if __name__ == "__main__":
    main()
