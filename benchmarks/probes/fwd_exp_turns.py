"""The d64 forward's consumers in turns at their exponentials: checked, then timed (attempt 72).

    python benchmarks/probes/fwd_exp_turns.py [--headdims 64] [--seqlens 1024 4096 16384] [--rounds 3]

probes/fwd_timeline.py (session 29) read the d64 forward's tile period at ~2650 clocks a consumer,
its softmax at ~1600 of them: the three consumers' 64 exponentials a thread ran at once on their
sub-partitions' SFUs (8 clocks a warp instruction), so each took three times its own 512 clocks,
and the SFU was busy 58% of the period. With TURNS each consumer waits for the one before it to
issue its P V product before it starts its exponentials (gluon_fwd._wait_turn). Predicted: a
consumer's chain (S ~340, max ~250, exponentials ~550 alone, P V ~350) fits in the others' two
exponential phases, so the period falls toward the SFU's and tensor cores' 1536 clocks a round;
+15-30% at d64 if the turns' waits stay short, a loss if a late K/V tile stalls the ring of turns.

Checked and timed by probes/switch_ab.py (O and the LSE against the oracle under each setting,
then the settings in turn, kernels alone). Measured: see docs/performance.md, attempt 72.
"""

from __future__ import annotations

import os
import sys

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switch_ab import arguments, check_and_time  # noqa: E402


def main():
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [64], [1024, 4096, 16384])
    check_and_time(hopper.FORWARD_EXP_TURNS_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
