"""The persistent d64 forward waiting for an item's output store late: checked, then timed (attempt 73).

    python benchmarks/probes/fwd_late_store.py [--headdims 64] [--seqlens 1024 4096 16384] [--rounds 3]

probes/fwd_timeline.py (session 29) read a d64 work item (a 192-row Q tile) at ~0.7 tile periods
(~1900 clocks) past its tiles' own, at 1k, 4k and 16k keys alike: the epilogue ~1100 clocks (O
scaled and staged in shared memory, a fence that also orders the LSE's global store before it,
the TMA store, its wait), and the next item's Q to its first S product ~550. The three consumers
end their items at about the same time, so the tensor cores idle through it. With
LATE_STORE_WAIT the LSE's store follows the TMA store's issue and the store's wait moves into the
next item, after its first S product is issued. Predicted: the fence's and the wait's share of the
epilogue (a few hundred clocks) off each item: +1-3% at 1k (8 tiles an item), less at 4k and 16k.

Checked and timed by probes/switch_ab.py (O and the LSE against the oracle under each setting,
then the settings in turn, kernels alone). Measured: see docs/performance.md, attempt 73.
"""

from __future__ import annotations

import os
import sys

from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switch_ab import arguments, check_and_time  # noqa: E402


def main():
    args = arguments(__doc__.splitlines()[0], ["0", "1"], [64], [1024, 4096, 16384])
    check_and_time(hopper.LATE_STORE_WAIT_SWITCH, args, which="fwd")


if __name__ == "__main__":
    main()
