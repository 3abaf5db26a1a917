"""The dense forward with part of P's exponentials on the FMA units: checked, then timed (attempt 71).

    python benchmarks/probes/fwd_exp_poly.py [--headdims 64] [--seqlens 1024 4096 16384] [--rounds 3]

A (rows × keys) tile's exponentials take rows·keys/16 SFU clocks per SM and its two products
rows·keys·d/1024 tensor-core clocks: at d64 the SFU is as busy as the tensor cores. The d64
forward (three consumers, 64 × 128 tiles, products in turn) issues ~419 instructions a warp per
K/V tile (sm_90 SASS, Triton 3.9), 64 of them MUFU.EX2 at 8 clocks each on its sub-partition's SFU
(512 clocks: the longest phase of the tile's chain). The polynomial (kernels/exp2_split.py) costs
9 instructions an element (FMA pipe but for one FSETP and SEL). Predicted, 1 of 4: the chain's SFU
phase 512 -> 384 clocks, the warp's issue 419 -> 563, the three consumers' sub-partition issue
(1257 -> 1689 a round) then past the tensor cores' 1536: a gain only while latency, not issue,
bounds it; 0-3% at d64, less at d128. 2 of 4: issue-bound, a loss.

Checked and timed by probes/switch_ab.py (O and the LSE against the oracle under each setting,
then the settings in turn, kernels alone). Measured: see docs/performance.md, attempt 71.
"""

from __future__ import annotations

import os
import sys

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switch_ab import arguments, check_and_time  # noqa: E402


def main():
    args = arguments(__doc__.splitlines()[0], ["0", "1", "2"], [64], [1024, 4096, 16384])
    check_and_time(hopper.FORWARD_EXP_POLY_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
