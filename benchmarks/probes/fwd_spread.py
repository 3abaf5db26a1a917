"""Persistent programs of a count coprime with a head's Q tiles: checked, then timed (attempt 74).

    python benchmarks/probes/fwd_spread.py [--headdims 64] [--seqlens 1024 2048 4096] [--rounds 3]

Non-causal persistent programs take their Q tiles in fixed turns (p, p + P, ...) of a grid whose
tiles run fastest, so with P = 132 SMs and a head's tiles sharing a factor with 132 (d64's 192-row
tiles: 6 a head at 1k, 11 at 2k, 22 at 4k) each program takes the same few tile ranks. The last
tile of a head whose length 192 does not divide holds one live 64-row part of three: the programs
that take those take only those, and the others only whole tiles, on which the grid ends.
hopper.spread_programs picks the largest count up to the SMs that shares no factor with the tiles
a head and takes no more turns (131 at 1k, 2k and 4k; auto runs 16k non-causal a program per tile,
and 131 programs there would take a 22nd turn). Predicted: at 1k the grid
ends on programs of mixed tiles, whose one-part tiles cost less than whole ones: +2-5% if a one-part
tile costs ~0.7 of a whole one (probes/fwd_timeline.py reads that once it traces such programs),
nothing if it costs as much; less at 2k and 4k (one tile in 11 and 22 has idle parts).

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
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [64], [1024, 2048, 4096])
    check_and_time(hopper.SPREAD_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
