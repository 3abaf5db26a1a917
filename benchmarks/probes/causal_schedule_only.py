"""The causal five-product backward's schedule without its causal code: which of the two costs the causal gap.

    python benchmarks/probes/causal_schedule_only.py [--headdim 128] [--seqlens 8192 16384] [--rounds 2]

Session 20: the fused kernel's causal time is 0.533 of its non-causal time where a model of the
grid's dispatch gives 0.497 (docs/performance.md, attempt 51 and next steps). Either the causal
schedule (programs of unequal length, heaviest first, each from its own diagonal) or the causal
code paths (the skipped-tile branch, the diagonal's mask: 19 more instructions in a step's hot
path of 411) cost the difference. This probe copies src/ into a temporary directory and patches
gluon_bwd_fused.py so that the consumers get CAUSAL=False while the program mapping keeps
CAUSAL=True: the same tiles, visited in the same order, with no causal code (its gradients are
wrong; only its time counts). It then times, in alternating subprocesses, the fused backward of
both trees (CUDA graphs, probes/gluon_sweep.time_config), causal and not, and prints each tree's
causal time over its non-causal time: at ~0.50 for the patched tree the causal code costs the
gap; at ~0.53 the schedule does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the consumers' constexpr arguments in _dkdv_dq_kernel's warp_specialize call (both warpgroups)
CONSUMER_ARGS = "HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, CAUSAL, REDUCE_BY_PTX,"
PATCHED_ARGS = "HEAD_DIM, BLOCK_M, HALF_N, NUM_STAGES, False, REDUCE_BY_PTX,"

TIMING = """
import os, sys
os.environ["FLASHTILE_GLUON_BWD"] = "1"
os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
sys.path.insert(0, {probes!r})
from gluon_sweep import time_config
for n in {seqlens!r}:
    full, causal = (time_config("bwd", {headdim}, n, c) for c in (False, True))
    # TFLOP/s count causal as half the work: time ratio = 0.5 * full / causal
    print(f"N={{n}} full {{full:.0f}} causal {{causal:.0f}} time-ratio {{0.5 * full / causal:.3f}}", flush=True)
"""


def patched_tree(where: Path) -> Path:
    """src/ copied under ``where`` with the fused consumers' CAUSAL set to False; its path."""
    tree = where / "src"
    shutil.copytree(ROOT / "src", tree, ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / "flashtile" / "kernels" / "gluon_bwd_fused.py"
    text = path.read_text()
    if text.count(CONSUMER_ARGS) != 2:
        raise SystemExit(f"{path}: expected the consumers' arguments {CONSUMER_ARGS!r} twice; the kernel changed, "
                         "update this probe")
    path.write_text(text.replace(CONSUMER_ARGS, PATCHED_ARGS))
    return tree


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    code = TIMING.format(probes=str(ROOT / "benchmarks" / "probes"), seqlens=args.seqlens, headdim=args.headdim)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"as built": ROOT / "src", "causal schedule, no causal code": patched_tree(Path(tmp))}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}")
                result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
                lines = [line for line in result.stdout.splitlines() if line.startswith("N=")]
                print(f"round {round_ + 1}, {name}:", *lines or [result.stderr[-2000:]], sep="\n  ", flush=True)


if __name__ == "__main__":
    main()
