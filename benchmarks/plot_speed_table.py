"""Plot a speed table (the JSON of ``benchmarks/speed_table.py --json``): TFLOP/s against N.

One panel per (pass, head dim, mask): forward in the top row, backward below, every
implementation the table measured as a line. The README's performance plot is

    python benchmarks/plot_speed_table.py benchmarks/results/2026-11-29-h200-issue3.json \\
        --out docs/images/speed_h200.png --title "H200, 2026-11-29"
"""

from __future__ import annotations

import argparse
import json

LABELS = {"flashtile": "flashtile", "sdpa-flash": "SDPA flash (FA2)", "sdpa-cudnn": "SDPA cuDNN",
          "sdpa-efficient": "SDPA mem-efficient"}


def plot(table: dict, out: str, title: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    rows = table["rows"]
    impls = [name for name in LABELS if any(name in row for row in rows)]
    panels = sorted({(row["headdim"], row["causal"]) for row in rows})
    fig = Figure(figsize=(3.4 * len(panels), 6.4), layout="constrained")
    axes = fig.subplots(2, len(panels), squeeze=False)
    for col, (headdim, causal) in enumerate(panels):
        cells = sorted((r for r in rows if (r["headdim"], r["causal"]) == (headdim, causal)), key=lambda r: r["seqlen"])
        for line, impl in enumerate(impls):
            for row_index, direction in enumerate(("fwd", "bwd")):
                points = [(r["seqlen"], r[impl][direction]) for r in cells
                          if impl in r and r[impl].get(direction) is not None]
                if not points:
                    continue
                xs, ys = zip(*points)
                axes[row_index][col].plot(xs, ys, marker="o", color=f"C{line}", label=LABELS[impl],
                                          linewidth=2.5 if impl == "flashtile" else 1.2)
        for row_index, direction in enumerate(("forward", "backward")):
            ax = axes[row_index][col]
            seqlens = [r["seqlen"] for r in cells]
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [f"{n // 1024}k" for n in seqlens])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.set_title(f"{direction} · D={headdim} · {'causal' if causal else 'full'}", fontsize=9)
            if col == 0:
                ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7)
    meta = table.get("meta", {})
    fig.suptitle(f"{title}: {meta.get('dtype', '')}, 16k tokens per batch, hidden 2048 "
                 f"(torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')})", fontsize=10)
    fig.supxlabel("sequence length", fontsize=9)
    fig.savefig(out, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table", help="JSON written by speed_table.py --json")
    p.add_argument("--out", default="speed.png")
    p.add_argument("--title", default="speed")
    args = p.parse_args(argv)
    with open(args.table) as f:
        plot(json.load(f), args.out, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
