"""The five-product backward with each step's lse2 row loaded during its Sᵀ product: checked, then timed.

    python benchmarks/probes/hoist_stats.py [--headdims 128] [--seqlens 4096 16384] [--rounds 5]

FLASHTILE_GLUON_BWD_HOIST_STATS (hopper.FUSED_HOIST_STATS, gluon_bwd._dkdv_tile's HOIST_STATS).
Session 21's ncu source view of the d128 16k kernel put most of its short-scoreboard stall samples
(13% of all) on the FFMA Sᵀ·scale − lse2 and the FADD dPᵀ − Delta, each waiting for its row's
LDS, issued only after the product it follows was waited for. Predicted: lse2's latency off the
path from Sᵀ to Pᵀ, ~1% at d128 (about 100 of a step's ~4400 cycles); d64 spills with it.

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
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [128], [4096, 16384])
    check_and_time(hopper.HOIST_STATS_SWITCH, args)


if __name__ == "__main__":
    main()
