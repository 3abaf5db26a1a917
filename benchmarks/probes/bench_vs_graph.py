"""Where the bench's forward time and a CUDA graph's part: one cell, timed four ways, FA2 beside.

    python benchmarks/probes/bench_vs_graph.py [--headdim 64] [--seqlens 1024 4096] [--rounds 3] [--backward]

Session 27 found the d64 causal 4k forward at 463 TFLOP/s as a CUDA graph of ``hopper.forward``
(probes/fwd_tree_ab.py) where the bench had read 435-449, while the non-causal 4k cell read the
same both ways (502 against 503). Both timings are do_bench medians with L2 flushed before each
call, so what differs is what runs per call. This probe times, in one process, B·N = 16k tokens,
H = 2048 / d, bf16, (B, H, N, d) tensors, each way the median of ``--rounds`` interleaved rounds:

- ``graph``: hopper.forward replayed from a CUDA graph (no host work);
- ``kernel``: hopper.forward called eagerly under do_bench (its host path, no autograd);
- ``api``: flashtile.attention with requires_grad inputs, as the bench calls it;
- ``api-turns``: the same with the persistent programs' dynamic scheduler off (fixed turns: no
  counter zeroed per call), where ``auto`` runs it (causal past 1k keys);
- ``fa2`` and ``fa2-graph``: SDPA's flash backend eagerly (as the bench does) and as a graph.

Prints TFLOP/s (4·B·H·N²·d / t, halved when causal) per way and cell.

``--backward`` times the backward the same ways (session 28; not yet run): ``graph`` and ``kernel``
are ``hopper.backward`` on the forward's output and LSE, ``api`` is ``torch.autograd.grad`` of
``flashtile.attention``'s output as the bench calls it, ``fa2`` the same of SDPA's flash backend;
``fa2-graph`` and ``api-turns`` are left out. TFLOP/s count the backward as 2.5 forwards. The 1k
backward cells read 0.54 ms (d128 causal, session 28) or 0.73 (session 27) on different leases:
this tells the host's share from the kernels' on the lease at hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import graph_ms  # noqa: E402

import flashtile  # noqa: E402
from flashtile.kernels import hopper  # noqa: E402


def ways(q, k, v, causal: bool) -> dict:
    """name -> a callable that returns its ms (one measurement)."""
    out = torch.empty_like(q)
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5

    def kernel():
        hopper.forward(q, k, v, out, scale, causal)

    def api():
        return flashtile.attention(qg, kg, vg, causal=causal, layout="bhsd")

    def fa2():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def fa2_plain():  # the graph's: no grad, so nothing of autograd is captured
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def api_turns():
        previous = hopper.PERSISTENT_DYNAMIC
        hopper.PERSISTENT_DYNAMIC = False
        try:
            return do_bench(api, warmup=25, rep=100, return_mode="median")
        finally:
            hopper.PERSISTENT_DYNAMIC = previous

    return {
        "graph": lambda: graph_ms(kernel),
        "kernel": lambda: do_bench(kernel, warmup=25, rep=100, return_mode="median"),
        "api": lambda: do_bench(api, warmup=25, rep=100, return_mode="median"),
        "api-turns": api_turns,
        "fa2": lambda: do_bench(fa2, warmup=25, rep=100, return_mode="median"),
        "fa2-graph": lambda: graph_ms(fa2_plain),
    }


def backward_ways(q, k, v, causal: bool) -> dict:
    """name -> a callable that returns its ms (one measurement) of a backward."""
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    lse = hopper.forward(q, k, v, out, scale, causal)
    dout = torch.randn_like(q)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    api_out = flashtile.attention(qg, kg, vg, causal=causal, layout="bhsd")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fa2_out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def kernel():
        hopper.backward(q, k, v, out, dout, lse, None, scale, causal, dq, dk, dv)

    def api():
        return torch.autograd.grad(api_out, (qg, kg, vg), dout, retain_graph=True)

    def fa2():
        return torch.autograd.grad(fa2_out, (qg, kg, vg), dout, retain_graph=True)

    return {
        "graph": lambda: graph_ms(kernel),
        "kernel": lambda: do_bench(kernel, warmup=25, rep=100, return_mode="median"),
        "api": lambda: do_bench(api, warmup=25, rep=100, return_mode="median"),
        "fa2": lambda: do_bench(fa2, warmup=25, rep=100, return_mode="median"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backward", action="store_true", help="time the backward instead of the forward")
    args = parser.parse_args()
    pass_name, make_ways, work = ("backward", backward_ways, 2.5) if args.backward else ("forward", ways, 1.0)
    d = args.headdim
    rows = []
    for causal in (False, True):
        for n in args.seqlens:
            batch, heads = max(16384 // n, 1), 2048 // d
            generator = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=generator)
                       for _ in range(3))
            timers = make_ways(q, k, v, causal)
            times: dict = {name: [] for name in timers}
            for _ in range(args.rounds):
                for name, timer in timers.items():
                    times[name].append(timer())
            flops = work * 4 * batch * heads * n * n * d / (2 if causal else 1)
            rates = {name: flops / statistics.median(ms) * 1e-9 for name, ms in times.items()}
            rows.append((causal, n, rates))
            print(f"d{d} {'causal' if causal else 'full'} {n}: "
                  + " ".join(f"{name} {' '.join(f'{ms:.4f}' for ms in t)}" for name, t in times.items()), flush=True)
    names = list(rows[0][2])
    print(f"\n{pass_name} TFLOP/s, d{d}, bf16, median of {args.rounds} rounds (ms per round above)")
    print(f"{'causal':>6} {'N':>6} | " + " | ".join(f"{name:>9}" for name in names) + " | api/graph | api/fa2")
    for causal, n, rates in rows:
        print(f"{'yes' if causal else 'no':>6} {n:>6} | " + " | ".join(f"{rates[name]:9.1f}" for name in names)
              + f" | {rates['api'] / rates['graph']:9.3f} | {rates['api'] / rates['fa2']:7.3f}")


if __name__ == "__main__":
    main()
