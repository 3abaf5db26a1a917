"""The five-product backward with part of its exponentials on the FMA units: checked, then timed.

    python benchmarks/probes/exp_poly.py [--headdims 64 128] [--seqlens 4096 16384] [--rounds 3]

kernels/exp2_split.py computes 1 or 2 of every 4 exponentials by a degree-3 polynomial (~10 FMA
and integer instructions each) instead of MUFU.EX2. The SFU does 16 exponentials a clock per SM:
a consumer warpgroup's tile is 64 keys × 128 queries at d64 (~512 SFU clocks a step, of a step of
~5300 at 3.0 µs) and 64 × 64 at d128 (~256 of ~4400), and the consumer waits on it before its dV
and dK products. Predicted: with 1 of 4 the SFU phase shortens by a quarter, the
polynomial's instructions issuing beside it; +2-3% at d64, +1-2% at d128; 2 of 4 about the same,
issue slots then the limit.
Measured (H200, session 21, 4k and 16k, against 0): gradients within tolerance for 1 and 2. One run
(3 rounds): 1 of 4 at d128 1.010-1.020, at d64 0.945-1.023; 2 of 4 0.931-1.023. The next (5
rounds, 0 and 1 only): d128 0.981-1.010, d64 0.967-1.018. No gain beyond the runs' spread: off.
Read again afterwards, session 21's ncu source view says why: "math pipe throttle", where a
saturated SFU would show, is 0.4% of the d128 kernel's stall samples; its short-scoreboard stalls
(13%) sit on the FFMA and FADD that consume the LDS of lse2 and Delta, not on MUFU results.

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
    args = arguments(__doc__.splitlines()[0], ["0", "1", "2"], [64, 128], [4096, 16384])
    check_and_time(hopper.EXP_POLY_SWITCH, args)


if __name__ == "__main__":
    main()
