"""A d64 Q tile of one live part on all three consumers, the keys split and merged: checked, then timed (attempt 75).

    python benchmarks/probes/fwd_split_keys.py [--headdims 64] [--seqlens 1024 2048 4096] [--rounds 3]
        [--settings 00 10 11]

A non-causal head whose length 192 does not divide ends in a Q tile whose only rows are its first
64-row part's at 1k and 4k (1024 = 5 × 192 + 64, 4096 = 21 × 192 + 64; at 2k two parts live, which
this leaves alone): one consumer runs them through every K/V tile while the other two idle. With
SPLIT_KEYS every consumer runs those rows over a third of the K/V tiles and consumer 0 merges the
three partials (max, sum, O) through shared memory. In fixed turns on 132 SMs those tiles all go to
programs 5, 11, ... (132 is a multiple of 6), which then finish early whatever they cost, so this
probe times three settings of (FLASHTILE_GLUON_FWD_SPREAD, FLASHTILE_GLUON_FWD_SPLIT_KEYS): 00
(neither), 10 (attempt 74's spread: 131 programs, each taking every tile rank in turn) and 11
(both). The causal rows take neither (both apply to non-causal rows only): they read the runs' noise.
Session 30 measured the first version, whose every item passed the merge's barriers: 0.97-1.02x the
spread alone, the whole items ~4% longer (each consumer held to the slowest at every item's end).
Now only split items pass them. Predicted over the spread alone: +3-4% at 1k (the one-part item
from ~0.78 of a whole item's time to ~0.57, one item in six), ~1% at 4k, nothing at 2k.

Checked and timed by probes/switch_ab.py (O and the LSE against the oracle under each setting,
then the settings in turn, kernels alone).
"""

from __future__ import annotations

import os
import sys

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switch_ab import arguments, check_and_time  # noqa: E402


def main():
    args = arguments(__doc__.splitlines()[0], ["00", "10", "11"], [64], [1024, 2048, 4096])
    check_and_time((hopper.SPREAD_SWITCH, hopper.SPLIT_KEYS_SWITCH), args, which="fwd")


if __name__ == "__main__":
    main()
