"""The persistent forward's consumers reading each item's coordinates from the loader: checked, then timed (attempt 77).

    python benchmarks/probes/fwd_early_coords.py [--headdims 64] [--seqlens 1024 2048 4096] [--rounds 7]

A persistent program's consumers each worked out the next item's batch, head, first row and K/V
tiles at its start (gluon_common.q_tile_of_program: integer divisions by runtime values, the
grid's groups, B·Hq rows, heads and GQA groups), between one item's output and the next item's
first S product. Session 29's timeline (probes/fwd_timeline.py, d64 non-causal) put an item at
~2100 clocks past its tiles' periods, ~610 of them the step to the next item (the Q buffer's
release and these coordinates). Under FLASHTILE_GLUON_FWD_EARLY_COORDS=1 the loader, which works
them out for its copies anyway, writes them to int32 slots of the item's Q buffer before it arms
that buffer's q_ready, and the consumers read them once Q is ready (gluon_fwd's EARLY_COORDS; in
fixed turns and on the dynamic scheduler alike). In the sm_90 SASS (CPU compile, Triton 3.6 and
3.9) each consumer's path from its output's TMA store to the next item's first HGMMA loses its
four integer divisions. Predicted: up to ~1-2% at 1k keys (8 tiles an item), less at 2k and 4k,
nothing if the next Q's wait or the store's wait, not the consumers' instructions, bound the step.

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
    check_and_time(hopper.EARLY_COORDS_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
