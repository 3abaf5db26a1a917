"""A d64 Q tile of one live part on all three consumers, the keys split and merged: checked, then timed (attempt 75).

    python benchmarks/probes/fwd_split_keys.py [--headdims 64] [--seqlens 1024 2048 4096] [--rounds 3]

A non-causal head whose length 192 does not divide ends in a Q tile whose only rows are its first
64-row part's at 1k and 4k (1024 = 5 × 192 + 64, 4096 = 21 × 192 + 64; at 2k two parts live, which
this leaves alone): one consumer runs them through every K/V tile while the other two idle. With
SPLIT_KEYS every consumer runs those rows over a third of the K/V tiles and consumer 0 merges the
three partials (max, sum, O) through shared memory. In fixed turns on 132 SMs those tiles all go to
programs 5, 11, ... (132 is a multiple of 6), which then finish early whatever they cost, so this
probe times it with FLASHTILE_GLUON_FWD_SPREAD=1 set (attempt 74: 131 programs, each taking every
tile rank in turn) unless the environment says otherwise. Predicted: the one-part tile from ~0.7-1
of a whole tile's time to ~0.55-0.7 (a third of its tiles on each consumer, but the ring's 2 stages
hold two of them at once, so two consumers work at a time; plus the merge): with the spread, +2-5%
at 1k, ~1% at 4k (one tile in 22), nothing at 2k; every item also passes the merge's barriers.

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
    os.environ.setdefault(hopper.SPREAD_SWITCH, "1")
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [64], [1024, 2048, 4096])
    print(f"{hopper.SPREAD_SWITCH}={os.environ[hopper.SPREAD_SWITCH]}")
    check_and_time(hopper.SPLIT_KEYS_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
