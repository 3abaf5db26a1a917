"""The five-product backward's dQ staging swizzle (FLASHTILE_GLUON_DQ_SWIZZLE 128, 64, 32): checked, then timed.

    python benchmarks/probes/dq_swizzle.py [--headdims 128 64] [--seqlens 16384] [--rounds 3] [--swizzles 128 64 32 0]

Session 21's Nsight Compute source view of the d128 16k fused kernel read every store of the
float32 dQ staging box at 4 shared-memory wavefronts where 2 would do: 134M excess wavefronts,
9% of the kernel's, in a kernel whose busiest unit is L1/shared memory (70-75%). A half-warp
stores rows r..r+3 of one 8-column group; TMA's 128-byte swizzle XORs the 16-byte chunk index
with row % 8, so for those rows the group's two chunks collide (hopper.DQ_SUM_SWIZZLE). The
64-byte swizzle collides the same way; the 32-byte one puts rows r..r+3 in one 128-byte line.
Unswizzled (0), the box's rows are 256 bytes (d128) and a half-warp's four rows hit the same
banks (4-way), but the TMA unit moves whole 256-byte rows.
Predicted: the 32-byte swizzle removes the excess and takes 1-3% off the kernel (its stall
samples at those stores: ~5% of the consumer warps'), causal and not, at both head dims.
Measured (H200, session 21, 16k, against 128, non-causal / causal): the conflicts gone under 32
(ncu), but every other swizzle slower: d128 64 B 0.967 / 0.977, 32 B 0.913 / 0.906, unswizzled
0.908 / 0.917; d64 64 B 1.000 / 0.983, 32 B 1.005 / 0.986, unswizzled 0.918 / 0.967. A box goes
out in parts as wide as its swizzle; narrower reduction rows cost more than the conflicts did.

1. Under each swizzle (``--swizzles``), the gradients against the float64 oracle (fused_bwd.check: GQA 6:2,
   1000 queries, 1100 keys; and 203 against 203), causal and not.
2. The backward's kernels alone (CUDA graphs, gluon_sweep.time_config: B·N = 16k tokens,
   H = 2048 / d, bf16), the swizzles in turn each round; medians, TFLOP/s, each ratio to 128.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_bwd import check  # noqa: E402
from gluon_sweep import time_config  # noqa: E402



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--swizzles", nargs="+", default=["128", "64", "32", "0"],
                        help="bytes; the first is the one the others are compared with")
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for swizzle in args.swizzles:
        os.environ[hopper.DQ_SWIZZLE_SWITCH] = swizzle
        for head_dim in args.headdims:
            for causal in (False, True):
                for seqlen_q, seqlen_k in ((1000, 1100), (203, 203)):
                    check(head_dim, causal, seqlen_q, seqlen_k)
        print(f"swizzle {swizzle}: gradients within the oracle's tolerance (d{args.headdims}, causal and not)",
              flush=True)
    print("\nbackward TFLOP/s, kernels alone (CUDA graphs), medians of", args.rounds, "rounds")
    for head_dim in args.headdims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                times = {s: [] for s in args.swizzles}
                for _ in range(args.rounds):
                    for swizzle in args.swizzles:
                        os.environ[hopper.DQ_SWIZZLE_SWITCH] = swizzle
                        times[swizzle].append(time_config("bwd", head_dim, seqlen, causal))
                medians = {s: statistics.median(t) for s, t in times.items()}
                base = medians[args.swizzles[0]]
                cells = "   ".join(f"{s:>3s}B {medians[s]:5.0f} ({medians[s] / base:5.3f})" for s in args.swizzles)
                print(f"d{head_dim:<4d} N={seqlen:<6d} {'causal' if causal else 'full  '}  {cells}", flush=True)


if __name__ == "__main__":
    main()
