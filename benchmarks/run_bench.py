"""``flashtile bench`` from a checkout: the same harness, the same flags.

    python benchmarks/run_bench.py --quick
    python benchmarks/run_bench.py --headdims 128 --seqlens 1k 16k --json benchmarks/results/out.json

The harness lives in the package (src/flashtile/bench/); `flashtile bench --help` lists the flags.
"""

import sys

from flashtile.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
