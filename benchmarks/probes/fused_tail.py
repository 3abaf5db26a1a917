"""The five-product backward's tail split against none (FLASHTILE_GLUON_BWD_TAIL 1 against 0): checked, then timed.

    python benchmarks/probes/fused_tail.py [--headdims 128 64] [--seqlens 8192 16384] [--rounds 3]

A non-causal fused grid of the speed table's shapes has 2048 programs at d128 (16k tokens × 16
heads / 128 keys) and 4096 at d64: on 132 SMs 15.52 and 31.03 waves of work in 16 and 32
waves. hopper.tail_split runs the last programs in parts (d128: the last 68 in 7 parts, 15.57
waves; d64: the last 4 in 4 parts, 31.25), their dK and dV summed from float32 partials by
gluon_bwd_fused._dkdv_parts_convert. Predicted: about 2% off the kernel at both head dims,
less the partials' traffic (~60 MB at d128 16k, ~25 µs).
Measured (H200, session 21): the gradients within tolerance; the split slower, 0.971-0.980x at
d128 (8k, 16k keys) and 0.926-0.942x at d64. Off under auto (hopper.TAIL_UNDER_AUTO).

1. With the split on, the gradients against the float64 oracle at a speed-table shape (d128 and
   d64, 16 × 1k; its programs are shorter than TAIL_MIN_STEPS allows a part, so that rule is
   lifted for the check) and the split it took (asserted taken).
2. The backward's kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens, H =
   2048 / d, bf16, non-causal), 0 and 1 in alternating rounds; medians, TFLOP/s. Under the rule
   as it stands the grid splits from 8k keys (parts of at least 32 steps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import flashtile
from flashtile.kernels import hopper
from flashtile.testing import assert_close_to_oracle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_sweep import time_config  # noqa: E402


def check(head_dim: int, seqlen: int) -> tuple:
    """Non-causal gradients with the split on, (16k / seqlen) × seqlen tokens and 2048 /
    head_dim heads; the last batch element (whose key tiles are the grid's last programs, the
    split ones) against the float64 oracle. Returns the split the call took."""
    batch, heads = 16384 // seqlen, 2048 // head_dim
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    taken = []
    take, min_steps = hopper._takes_tail_split, hopper.TAIL_MIN_STEPS
    hopper._takes_tail_split = lambda *args: (taken.append(take(*args)), taken[-1])[1]
    hopper.TAIL_MIN_STEPS = 0
    try:
        grads = torch.autograd.grad(flashtile.attention(q, k, v, layout="bhsd"), (q, k, v), dout)
    finally:
        hopper._takes_tail_split, hopper.TAIL_MIN_STEPS = take, min_steps
    assert len(taken) == 1 and taken[0] is not None, f"the check's grid did not split: {taken}"
    b = slice(batch - 1, batch)
    expected, plain = ([*torch.autograd.grad(
        flashtile.naive_attention(*(t[b] for t in (q, k, v)), layout="bhsd", upcast=upcast), (q, k, v), dout[b])]
        for upcast in (True, False))
    for name, g, e, p in zip(("dq", "dk", "dv"), grads, expected, plain):
        assert_close_to_oracle(name, g[b], e[b], p[b], grad=True)
    return taken[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__,
          f"{hopper.sm_count(torch.device('cuda'))} SMs")
    os.environ[hopper.TAIL_SWITCH] = "1"
    for head_dim in args.headdims:
        split = check(head_dim, 1024)
        print(f"d{head_dim} 16 x 1k, split {split}: gradients within the oracle's tolerance", flush=True)
    print("\nnon-causal backward TFLOP/s, kernels alone (CUDA graphs), medians of", args.rounds, "rounds")
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            times = {"0": [], "1": []}
            for _ in range(args.rounds):
                for switch in times:
                    os.environ[hopper.TAIL_SWITCH] = switch
                    times[switch].append(time_config("bwd", head_dim, seqlen, False))
            off, on = (statistics.median(times[s]) for s in ("0", "1"))
            print(f"d{head_dim:<4d} N={seqlen:<6d} whole {off:5.0f}   split {on:5.0f}   ratio {on / off:5.3f}   "
                  f"(rounds: {' '.join(f'{t:.0f}' for t in times['1'])})", flush=True)


if __name__ == "__main__":
    main()
