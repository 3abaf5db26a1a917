"""Plot a speed table (the JSON of ``benchmarks/speed_table.py --json`` or of ``flashtile bench
--json``, dense bf16 cells): TFLOP/s against N.

One panel per (pass, head dim, mask): forward in the top row, backward below, every
implementation the table measured as a line. The README's performance plot is

    python benchmarks/plot_speed_table.py benchmarks/results/2026-11-30-h200-session12/bench.json \\
        --out docs/images/speed_h200.png --title "H200, 2026-11-30"
"""

from __future__ import annotations

import argparse
import json

from flashtile.bench.providers import PROVIDERS


def table_from_bench(data: dict) -> dict:
    """speed_table.py's layout ({"meta", "rows": [{headdim, causal, seqlen, impl: {fwd, bwd}}]})
    of a ``flashtile bench --json`` file's dense bf16 cells."""
    rows = {}
    for cell in data["results"]:
        if cell["scenario"] != "dense" or cell["dtype"] != "bf16" or cell.get("tflops") is None:
            continue
        key = (cell["headdim"], cell["causal"], cell["seqlen"])
        row = rows.setdefault(key, {"headdim": key[0], "causal": key[1], "seqlen": key[2]})
        row.setdefault(cell["provider"], {})[cell["mode"]] = cell["tflops"]
    meta = data.get("meta", {})
    return {"meta": {"dtype": "bfloat16", "torch": meta.get("torch"), "triton": meta.get("triton")},
            "rows": [rows[key] for key in sorted(rows)]}


def plot(table: dict, out: str, title: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    from flashtile.bench.report import draw_panel  # the bench's panels: same colours and labels

    rows = table["rows"]
    impls = [name for name in PROVIDERS if any(name in row for row in rows)]
    panels = sorted({(row["headdim"], row["causal"]) for row in rows})
    fig = Figure(figsize=(3.4 * len(panels), 6.4), layout="constrained")
    axes = fig.subplots(2, len(panels), squeeze=False)
    for col, (headdim, causal) in enumerate(panels):
        cells = sorted((r for r in rows if (r["headdim"], r["causal"]) == (headdim, causal)), key=lambda r: r["seqlen"])
        for row_index, direction in enumerate(("fwd", "bwd")):
            lines = {impl: [(r["seqlen"], r[impl][direction]) for r in cells
                            if impl in r and r[impl].get(direction) is not None] for impl in impls}
            pass_name = "forward" if direction == "fwd" else "backward"
            panel = f"{pass_name} · D={headdim} · {'causal' if causal else 'full'}"
            draw_panel(axes[row_index][col], {impl: points for impl, points in lines.items() if points}, panel)
    meta = table.get("meta", {})
    fig.suptitle(f"{title}: {meta.get('dtype', '')}, 16k tokens per batch, hidden 2048 "
                 f"(torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')})", fontsize=10)
    fig.savefig(out, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table", help="JSON written by speed_table.py --json or flashtile bench --json")
    p.add_argument("--out", default="speed.png")
    p.add_argument("--title", default="speed")
    args = p.parse_args(argv)
    with open(args.table) as f:
        data = json.load(f)
    plot(table_from_bench(data) if "results" in data else data, args.out, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
