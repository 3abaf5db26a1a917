"""The five-product backward with each step's dK product left in flight through the meeting: checked, then timed.

    python benchmarks/probes/defer_dk.py [--headdims 64 128] [--seqlens 4096 16384] [--rounds 3]

FLASHTILE_GLUON_BWD_DEFER_DK (hopper.FUSED_DEFER_DK, gluon_bwd_fused's DEFER_DK; attempt 66). Each
step the two consumer warpgroups meet at the dS buffer before their dQ products, so they run in
step: without it each waits for its dK product, then fences, meets and waits for the other with
nothing of its own on the tensor cores. With it dK (and dV) stay in flight through the meeting and
are waited for with dQ. Predicted: the meeting's latency (fence, named barrier, mbarrier round trip:
a few hundred of a d64 step's ~2800 cycles) hidden under dK's product, +2-5% at d64, less at d128
(longer steps). Under Triton 3.6 the causal builds spill more: d64 72 -> 96 bytes of stack, d128 16 -> 40.

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
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [64, 128], [4096, 16384])
    check_and_time(hopper.DEFER_DK_SWITCH, args)


if __name__ == "__main__":
    main()
