"""Overlay the loss curves of several train_gpt.py runs and tabulate them.

    python examples/train_gpt.py --attn flashtile --out runs/flashtile
    python examples/train_gpt.py --attn naive --out runs/naive
    python examples/compare_runs.py runs/flashtile runs/naive --out runs/compare.png

The table gives, per run, the largest |loss difference| from the first run at the
same step: runs with the same seed see the same weights and batches, so this is
the effect of the attention implementation alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_gpt import plot_losses  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="output folders of train_gpt.py (each holds log.json)")
    p.add_argument("--out", type=Path, default=Path("runs/compare.png"))
    args = p.parse_args(argv)

    logs = {run.name: json.loads((run / "log.json").read_text()) for run in args.runs}
    table = Table("run", "attn", "status", "context", "loss, step 0", "loss, last 10", "max |Δ| vs first",
                  "tokens/s", "peak MiB")
    first = next(iter(logs.values()))
    for name, log in logs.items():
        ok = log["status"] == "ok"
        deltas = [abs(a["loss"] - b["loss"]) for a, b in zip(log["steps"], first["steps"])]
        table.add_row(
            name, log["config"]["attn"], log["status"], str(log["config"]["context"]),
            f"{log['initial_loss']:.4f}" if ok else "-", f"{log['final_loss']:.4f}" if ok else "-",
            f"{max(deltas):.2e}" if deltas else "-",
            f"{log['tokens_per_s']:,.0f}" if ok and log.get("tokens_per_s") else "-",
            f"{log['peak_memory_bytes'] / 2**20:.1f}" if "peak_memory_bytes" in log else "-",
        )
    Console(width=max(120, Console().width)).print(table)
    finished = {name: log for name, log in logs.items() if log["steps"]}
    if finished:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        error = plot_losses(finished, args.out)
        print(error or f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
