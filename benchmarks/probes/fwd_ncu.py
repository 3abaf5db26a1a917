"""One non-causal and one causal Gluon forward (bf16, N = 16k, 2048 / d heads), for Nsight Compute's source view.

    ncu --target-processes all -k regex:_fwd_pingpong -c 2 --section SourceCounters --section WarpStateStats \\
        --section InstructionStats -o fwd python benchmarks/probes/fwd_ncu.py [--headdim 64]
    ncu -i fwd.ncu-rep --page source --csv --print-source sass > fwd-source.csv
    python benchmarks/probes/ncu_source_summary.py fwd-source.csv

(`gpu_final.sh ncu-fwd` runs the three.) The d64 forward is the cell furthest from the targets
(1.43-1.46x FA2 and 1.11-1.15x FlexAttention from 4k, session 21): where its consumer warps stall,
instruction by instruction, as session 21 read the five-product backward's (which found the
lse2 loads behind attempt 56).
"""

from __future__ import annotations

import argparse
import os

import torch

from flashtile.kernels import hopper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=16384)
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON"] = "1"
    heads, scale = 2048 // args.headdim, args.headdim ** -0.5
    for causal in (False, True):
        q, k, v = (torch.randn(1, heads, args.seqlen, args.headdim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        out = torch.empty_like(q)
        hopper.forward(q, k, v, out, scale, causal)
        torch.cuda.synchronize()
        print(f"d{args.headdim} N={args.seqlen} {'causal' if causal else 'full'}: one Gluon forward", flush=True)


if __name__ == "__main__":
    main()
