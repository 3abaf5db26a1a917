"""The five-product backward's dQ staging swizzle (FLASHTILE_GLUON_DQ_SWIZZLE): checked, then timed.

    python benchmarks/probes/dq_swizzle.py [--headdims 128 64] [--seqlens 16384] [--rounds 3] [--settings 128 64 32 0]

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

Checked and timed by probes/switch_ab.py (the oracle under each setting, then the settings in
turn, kernels alone).
"""

from __future__ import annotations

import os
import sys

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switch_ab import arguments, check_and_time  # noqa: E402


def main():
    args = arguments(__doc__.splitlines()[0], ["128", "64", "32", "0"], [128, 64], [16384])
    check_and_time(hopper.DQ_SWIZZLE_SWITCH, args)


if __name__ == "__main__":
    main()
