"""The dense Gluon forward with each row's max and sum folded as trees: checked, then timed.

    python benchmarks/probes/row_tree.py [--headdims 64 128 256] [--seqlens 1024 4096 16384] [--rounds 5]

FLASHTILE_GLUON_FWD_ROW_TREE (hopper.FORWARD_ROW_TREE, gluon_fwd._softmax_update's ROW_TREE,
gluon_common.row_max / row_sum). Session 22's ncu source view of the d64 16k forward put its most
stall samples on "wait" (fixed-latency dependencies, 32% of the consumers' samples), and its SASS
(Triton 3.6) folds each row's 32 columns a thread holds into one chain of dependent FMNMX before
the quad's shuffles and the exponentials: ~32 × 4 clocks with nothing else of that warp to
issue. The tree is 5 steps deep. Predicted: d64 +2-5% (a softmax step ~2200 clocks a tile
pair at 456 TFLOP/s, ~100 of them this chain), d128 and d256 less (their products hide more).

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
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [64, 128, 256], [1024, 4096, 16384])
    check_and_time(hopper.ROW_TREE_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
