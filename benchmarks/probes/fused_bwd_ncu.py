"""One non-causal and one causal five-product backward (d128, N = 16k, 16 heads, bf16), for
Nsight Compute to compare the two kernels.

    ncu --target-processes all -k regex:_dkdv_dq -c 2 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        python benchmarks/probes/fused_bwd_ncu.py [--headdim 128] [--seqlen 16384]

(`ncu` is /usr/local/cuda/bin/ncu on the GPU image; add --section WarpStateStats --section
SchedulerStats --section ComputeWorkloadAnalysis for issue and stall statistics.)

Session 20 found the fused kernel's causal time at 0.533 of its non-causal time where a model
of the grid's dispatch gives 0.497 (docs/performance.md, attempt 51). Under ncu (clocks locked
to base) both kernels read an L2 hit rate of 97-97.5% and DRAM throughput of 1.6-2.1% of peak,
SM busy 61% non-causal and 58% causal, executed IPC 0.84 and 0.80: not bound by DRAM or L2
(L1/shared-memory throughput 75% and 70%, the busiest unit)
(benchmarks/results/2026-12-01-h200-session20/ncu-fused-*.log).
"""

from __future__ import annotations

import argparse
import os

import torch

from flashtile.kernels import hopper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=16384)
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
    heads, scale = 2048 // args.headdim, args.headdim ** -0.5
    for causal in (False, True):
        q, k, v, dout = (torch.randn(1, heads, args.seqlen, args.headdim, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        out = torch.empty_like(q)
        lse = hopper.forward(q, k, v, out, scale, causal)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        hopper.backward(q, k, v, out, dout, lse, None, scale, causal, dq, dk, dv)
        torch.cuda.synchronize()
        print(f"d{args.headdim} N={args.seqlen} {'causal' if causal else 'full'}: one fused backward", flush=True)


if __name__ == "__main__":
    main()
