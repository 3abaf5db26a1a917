"""Sweep the Gluon kernels' tile configs on an H100/H200 (sm_90): each candidate checked, then timed.

    python benchmarks/probes/gluon_sweep.py --which fwd bwd --headdims 64 128 [--seqlens 1024 4096 16384]

Candidates come from ``CANDIDATES`` below, screened on the CPU first (session 9, triton 3.6,
sm_90, causal, bf16; registers of 240 per consumer thread): at d64 the dK/dV kernel reaches
R173 with 64-row Q tiles and R237 (8 bytes of spill) with 128, shared memory 66-164 KiB for
2-4 stages; dQ reaches R121 with 64-key tiles and R203 with 128 (256 spills 1940 bytes, not
a candidate); the d64 forward R207 with 128-key tiles, R130 with 64. The first of each list
is the current table entry (kernels/hopper.py). For each candidate:

1. correctness: B = 1, 6 query heads on 2 K/V heads, Sq = 1000, Sk = 1100, causal and not,
   bf16; the output (forward) or dq, dk, dv (backward) against the float64 oracle
   (``naive_attention`` on float64 copies of the same inputs). A candidate passes when its max
   error is at most twice the Triton kernels' on the same case plus 1e-3 · max |reference|;
2. time: a CUDA graph of the kernels alone (no host time), bf16, 16k tokens, H = 2048 / d:
   the forward's one launch, or the backward's preprocess + dK/dV + dQ. With --api, calls of
   flashtile.attention (host path included) instead, after a row for the Triton kernels. TFLOP/s =
   4·B·H·N²·d (×2.5 backward), halved when causal.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import flashtile
from flashtile.kernels import hopper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from launch_overhead import median_ms  # noqa: E402
from timing import graph_ms  # noqa: E402  (a CUDA graph's replay, no host time)

# (BLOCK_N, NUM_STAGES) forward; backward (dK/dV (BLOCK_M, BLOCK_N, stages), dQ (BLOCK_M, BLOCK_N, stages)).
CANDIDATES = {
    "fwd": {64: [(128, 2), (128, 3), (64, 3), (64, 4)],
            128: [None, (128, 2), (128, 3)],  # None: the table's rule (2 stages below 4k keys, 3 from 4k)
            256: [(64, 2)]},
    "bwd": {64: [((128, 128, 2), (128, 64, 3)), ((64, 128, 3), (128, 64, 3)), ((64, 128, 3), (128, 128, 2)),
                 ((128, 128, 2), (128, 128, 2)), ((128, 128, 3), (128, 128, 3))],
            128: [((64, 128, 2), (128, 128, 2)), ((64, 128, 2), (128, 64, 3))],
            # d256: gluon_bwd_wide's dK/dV (BLOCK_N must be 64); dQ with 32-key tiles in 2 stages
            # or 64-key tiles in 1 (140 bytes of spill on the CPU compile, triton 3.6)
            256: [((64, 64, 2), (128, 32, 2)), ((64, 64, 2), (128, 64, 1))]},
}


def reference(q, k, v, dout, causal):
    """The float64 oracle (naive attention on float64 copies) and its gradients; (B, Hq, S, d)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = flashtile.naive_attention(*leaves, causal=causal, layout="bhsd", upcast=True)
    return (out, *torch.autograd.grad(out, leaves, dout.to(out.dtype)))


def flashtile_result(q, k, v, dout, causal, which):
    """flashtile.attention's output (fwd) or gradients (bwd), (B, Hq, S, d) layout."""
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = flashtile.attention(qg, kg, vg, causal=causal, layout="bhsd")
    if which == "fwd":
        return (out,)
    return torch.autograd.grad(out, (qg, kg, vg), dout)


def max_errors(results, expected):
    return [(r.float() - e).abs().max().item() for r, e in zip(results, expected)]


def check(which, head_dim, causal, set_env) -> bool:
    torch.manual_seed(0)
    q = torch.randn(1, 6, 1000, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 1100, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    ref = reference(q, k, v, dout, causal)
    expected = ref[:1] if which == "fwd" else ref[1:]
    set_env("0")
    triton_err = max_errors(flashtile_result(q, k, v, dout, causal, which), expected)
    set_env("1")
    gluon_err = max_errors(flashtile_result(q, k, v, dout, causal, which), expected)
    bounds = [2 * t + 1e-3 * e.abs().max().item() for t, e in zip(triton_err, expected)]
    return all(g <= b for g, b in zip(gluon_err, bounds))


def time_config(which, head_dim, seqlen, causal, api=False) -> float:
    """TFLOP/s of one cell: a CUDA graph of the kernels alone, or with ``api`` flashtile.attention
    (its backward: torch.autograd.grad) as a user calls it, host path included."""
    batch, heads = 16384 // seqlen, 2048 // head_dim
    q, k, v, dout = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    scale = head_dim ** -0.5
    if api:
        leaves = [t.requires_grad_() for t in (q, k, v)]
        result = flashtile.attention(*leaves, causal=causal, layout="bhsd")
        if which == "fwd":
            ms = median_ms(lambda: flashtile.attention(*leaves, causal=causal, layout="bhsd"), q.device)
        else:
            ms = median_ms(lambda: torch.autograd.grad(result, leaves, dout, retain_graph=True), q.device)
    else:
        out = torch.empty_like(q)
        lse = hopper.forward(q, k, v, out, scale, causal)
        if which == "fwd":
            ms = graph_ms(lambda: hopper.forward(q, k, v, out, scale, causal))
        else:
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            ms = graph_ms(lambda: hopper.backward(q, k, v, out, dout, lse, None, scale, causal, dq, dk, dv))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1) * (2.5 if which == "bwd" else 1)
    return flops / ms * 1e-9


def apply(which, head_dim, config):
    """Point kernels/hopper.py's tables at ``config``; returns the function that undoes it."""
    if which == "fwd":
        original = hopper._config
        hopper._config = (original if config is None else
                          lambda d, n: config if d == head_dim else original(d, n))
        return lambda: setattr(hopper, "_config", original)
    saved = hopper.BWD_DKDV[head_dim], hopper.BWD_DQ[head_dim]
    hopper.BWD_DKDV[head_dim], hopper.BWD_DQ[head_dim] = config
    return lambda: (hopper.BWD_DKDV.__setitem__(head_dim, saved[0]), hopper.BWD_DQ.__setitem__(head_dim, saved[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--which", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    parser.add_argument("--headdims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--api", action="store_true",
                        help="time flashtile.attention (host path included) instead of CUDA graphs of the kernels, "
                             "with a row for the Triton kernels first")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for which in args.which:
        name = "FLASHTILE_GLUON" if which == "fwd" else "FLASHTILE_GLUON_BWD"

        def set_env(value, name=name):
            os.environ[name] = value

        for head_dim in args.headdims:
            if args.api:  # the Triton kernels' row first: what auto would otherwise run
                set_env("0")
                cells = [f"{time_config(which, head_dim, n, c, api=True):5.0f}"
                         for c in (False, True) for n in args.seqlens]
                set_env("auto")
                print(f"{which} d{head_dim} triton: full then causal at {args.seqlens}: {' '.join(cells)}")
            for config in CANDIDATES[which].get(head_dim, []):
                undo = apply(which, head_dim, config)
                try:
                    ok = all(check(which, head_dim, causal, set_env) for causal in (False, True))
                    cells = []
                    if ok:
                        for causal in (False, True):
                            set_env("1")
                            cells += [f"{time_config(which, head_dim, n, causal, api=args.api):5.0f}"
                                      for n in args.seqlens]
                    row = " ".join(cells) if ok else "FAILED the check: not timed"
                except Exception as err:  # a config this GPU cannot run (shared memory, registers)
                    row = f"{type(err).__name__}: {str(err).splitlines()[0][:90]}"
                finally:
                    undo()
                    set_env("auto")
                print(f"{which} d{head_dim} {config}: full then causal at {args.seqlens}: {row}", flush=True)


if __name__ == "__main__":
    main()
