"""What ``flashtile bench`` shows and writes: console tables, JSON, PNG plots.

Ratios are flashtile over the other provider, measured in the same run: above 1,
flashtile is faster. A cell that did not run shows "—"; why is listed below the tables
and kept in the JSON.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from collections import Counter
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from . import targets
from .harness import DTYPE_NAMES, FirstCall, Grid, Measurement, Timer, speedup
from .providers import PROVIDERS

SCHEMA = 1


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_describe() -> str | None:
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                                timeout=5, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def collect_meta(device: torch.device, grid: Grid, timer: Timer, flashtile_backend: str,
                 cold_cache: bool) -> dict:
    from .. import __version__

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device.type,
        "gpu": None,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "flash_attn": _version("flash-attn") or _version("flash_attn"),
        "flashtile": __version__,
        "flashtile_git": _git_describe(),
        "flashtile_backend": flashtile_backend,
        "python": platform.python_version(),
        "dtype": [DTYPE_NAMES[d] for d in grid.dtypes],
        "timer": timer.method,
        "cold_cache": cold_cache,
        "env": {name: os.environ.get(name) for name in
                ("FLASHTILE_BACKEND", "FLASHTILE_AUTOTUNE", "FLASHTILE_GLUON", "FLASHTILE_GLUON_BWD",
                 "FLASHTILE_GLUON_BWD_FUSED", "FLASHTILE_GLUON_BWD_TAIL", "FLASHTILE_GLUON_DQ_SWIZZLE",
                 "FLASHTILE_GLUON_BWD_EXP_POLY", "FLASHTILE_GLUON_BWD_HOIST_STATS",
                 "FLASHTILE_GLUON_FWD_CONSUMERS", "FLASHTILE_GLUON_FWD_PERSISTENT",
                 "FLASHTILE_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_INTERPRET")},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta["gpu"] = props.name
        meta["gpu_capability"] = f"{props.major}.{props.minor}"
        meta["cudnn"] = torch.backends.cudnn.version()
    else:
        meta["cpu"] = platform.processor() or platform.machine()
        meta["cpu_threads"] = torch.get_num_threads()
    return meta


def grid_json(grid: Grid) -> dict:
    return {
        "scenarios": [{"name": s.name, "window": s.window, "documents": s.documents} for s in grid.scenarios],
        "dtypes": [DTYPE_NAMES[d] for d in grid.dtypes], "headdims": list(grid.headdims),
        "causal": list(grid.causal), "seqlens": list(grid.seqlens), "modes": list(grid.modes),
        "tokens": grid.tokens, "hidden": grid.hidden,
    }


def to_json(meta: dict, grid: Grid, providers: list[str], measurements: list[Measurement],
            calls: list[FirstCall], *, complete: bool) -> dict:
    return {
        "schema": SCHEMA,
        "complete": complete,
        "meta": meta,
        "grid": grid_json(grid),
        "providers": {name: PROVIDERS[name].label for name in providers},
        "results": [m.to_json() for m in measurements],
        "first_call": [c.to_json() for c in calls],
        "targets": [{"target": r.target.description, "provider": r.target.provider, "ratio": r.target.ratio,
                     "cells": r.cells, "met": r.met, "worst_ratio": r.worst_ratio, "worst_cell": r.worst_cell,
                     "holds": r.holds} for r in targets.check(measurements)],
    }


def write_json(path: str | Path, document: dict) -> None:
    """Atomically: a long run rewrites the file after every cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(path)


# -- console


def _panels(measurements: list[Measurement]) -> dict[tuple, dict[tuple, dict[str, Measurement]]]:
    """(scenario, dtype, mode) -> (headdim, causal, seqlen) -> provider -> cell, in run order."""
    panels: dict[tuple, dict[tuple, dict[str, Measurement]]] = {}
    for m in measurements:
        c = m.case
        key = (c.scenario.name, DTYPE_NAMES[c.dtype], m.mode)
        panels.setdefault(key, {}).setdefault((c.headdim, c.causal, c.seqlen), {})[m.provider] = m
    return panels


def _seqlen(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def tables(measurements: list[Measurement], providers: list[str]) -> list[Table]:
    """One table per (scenario, dtype, mode); columns are providers with at least one number."""
    out = []
    for (scenario, dtype, mode), rows in _panels(measurements).items():
        shown = [p for p in providers if any(cells.get(p) and cells[p].status == "ok" for cells in rows.values())]
        if not shown:
            continue
        # A CPU smoke run does well under 1 TFLOP/s: show it in GFLOP/s rather than as zeros.
        peak = max(cell.tflops for cells in rows.values() for cell in cells.values() if cell.status == "ok")
        unit, scale = ("TFLOP/s", 1.0) if peak >= 1 else ("GFLOP/s", 1e3)
        table = Table(title=f"{scenario} · {dtype} · {mode}: {unit}", title_justify="left",
                      caption="×: flashtile over the provider, same run (> 1: flashtile faster; with rounds, "
                              "the median of the rounds' ratios)",
                      caption_justify="left")
        for name in ("D", "causal", "N", "B×H"):
            table.add_column(name, justify="right")
        if "flashtile" in shown:
            table.add_column("flashtile ms", justify="right")
        for p in shown:
            table.add_column(p, justify="right")
        for (headdim, causal, seqlen), cells in rows.items():
            case = next(iter(cells.values())).case
            ft = cells.get("flashtile")
            ft_ok = ft is not None and ft.status == "ok"
            row = [str(headdim), "yes" if causal else "no", _seqlen(seqlen), f"{case.batch}×{case.heads}"]
            if "flashtile" in shown:
                row.append(f"{ft.ms:.3g}" if ft_ok else "—")
            for p in shown:
                cell = cells.get(p)
                if cell is None or cell.status != "ok":
                    row.append("—")
                elif p == "flashtile" or not ft_ok:
                    row.append(_rate(cell.tflops * scale))
                else:
                    row.append(f"{_rate(cell.tflops * scale)} ×{speedup(ft, cell):.2f}")
            table.add_row(*row)
        out.append(table)
    return out


def _rate(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def not_run_table(measurements: list[Measurement]) -> Table | None:
    counts = Counter((m.provider, m.status, m.reason) for m in measurements if m.status != "ok")
    if not counts:
        return None
    table = Table(title="Cells not measured", title_justify="left")
    for name in ("provider", "status", "cells", "reason"):
        table.add_column(name, justify="right" if name == "cells" else "left")
    for (provider, status, reason), n in counts.items():
        table.add_row(provider, status, str(n), reason or "")
    return table


def first_call_table(calls: list[FirstCall], cold_cache: bool,
                     providers: tuple[str, ...] = ("flashtile", "flex")) -> Table | None:
    rows = [c for c in calls if c.provider in providers]
    if not rows:
        return None
    caches = ("fresh on-disk caches (--cold-cache): a new machine's cost" if cold_cache else
              "on-disk compile caches as found; --cold-cache shows a new machine's cost")
    table = Table(title="First-call cost per shape class (wall clock; one-time ≈ first call − steady: "
                        "compile, tuning, set-up)",
                  title_justify="left", caption=caches, caption_justify="left")
    for name in ("provider", "scenario", "dtype", "D", "causal", "pass", "first N", "first call", "steady",
                 "≈ one-time", "later sizes, max"):
        table.add_column(name, justify="left" if name in ("provider", "scenario", "dtype", "pass") else "right")
    for c in rows:
        scenario, dtype, headdim, causal = c.shape_class
        table.add_row(c.provider, scenario, dtype, str(headdim), "yes" if causal else "no", c.mode,
                      _seqlen(c.seqlen), _ms(c.first_call_ms), _ms(c.steady_ms), _ms(c.overhead_ms),
                      _ms(c.later_max_ms) if c.later_max_ms is not None else "—")
    return table


def targets_table(measurements: list[Measurement]) -> Table | None:
    """The speed targets on this run's cells (targets.py); None when none applies."""
    results = targets.check(measurements)
    if not results:
        return None
    table = Table(title="Speed targets (docs/performance.md), on this run's cells", title_justify="left",
                  caption="worst: the smallest ratio of flashtile over that provider among the cells compared",
                  caption_justify="left")
    for name in ("target", "cells", "met", "worst", "holds"):
        table.add_column(name, justify="left" if name in ("target", "worst") else "right")
    for r in results:
        table.add_row(r.target.description, str(r.cells), str(r.met), f"×{r.worst_ratio:.2f} ({r.worst_cell})",
                      "[green]yes[/]" if r.holds else "[red]no[/]")
    return table


def _ms(ms: float) -> str:
    return f"{ms / 1e3:.2f} s" if ms >= 1000 else f"{ms:.3g} ms"


def print_report(console: Console, measurements: list[Measurement], providers: list[str],
                 calls: list[FirstCall], *, cold_cache: bool = False) -> None:
    for table in tables(measurements, providers):
        console.print(table)
    for table in (targets_table(measurements), first_call_table(calls, cold_cache), not_run_table(measurements)):
        if table is not None:
            console.print(table)


# -- plots


def matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "plots need matplotlib: pip install 'flashtile[bench]' (or pip install matplotlib)"
    return None


def write_plots(directory: str | Path, measurements: list[Measurement], providers: list[str],
                meta: dict) -> list[Path]:
    """One PNG per panel (scenario, dtype, mode, headdim, causal): TFLOP/s against N,
    and one overview per (scenario, dtype, mode) with every panel of it."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    threads = meta.get("cpu_threads")
    where = meta.get("gpu") or f"CPU ({threads} thread{'' if threads == 1 else 's'})"
    footer = f"{where} · torch {meta['torch']} · triton {meta['triton']} · {meta['date'][:10]}"
    written = []
    for (scenario, dtype, mode), rows in _panels(measurements).items():
        panels: dict[tuple, dict[str, list[tuple[int, float]]]] = {}
        for (headdim, causal, seqlen), cells in rows.items():
            lines = panels.setdefault((headdim, causal), {})
            for p in providers:
                cell = cells.get(p)
                if cell is not None and cell.status == "ok":
                    lines.setdefault(p, []).append((seqlen, cell.tflops))
        stem = f"{scenario}-{dtype}-{mode.replace('+', '')}"
        for (headdim, causal), lines in panels.items():
            fig = Figure(figsize=(6.4, 4.2), layout="constrained")
            title = f"{scenario} · {dtype} · {mode} · D={headdim} · {'causal' if causal else 'full'}"
            draw_panel(fig.add_subplot(), lines, title)
            fig.supxlabel(footer, fontsize=7)
            path = directory / f"{stem}-d{headdim}-{'causal' if causal else 'full'}.png"
            fig.savefig(path, dpi=120)
            written.append(path)
        headdims = sorted({d for d, _ in panels})
        causals = sorted({c for _, c in panels})
        fig = Figure(figsize=(5.0 * len(causals), 3.6 * len(headdims)), layout="constrained")
        axes = fig.subplots(len(headdims), len(causals), squeeze=False)
        for (headdim, causal), lines in panels.items():
            ax = axes[headdims.index(headdim)][causals.index(causal)]
            draw_panel(ax, lines, f"D={headdim} · {'causal' if causal else 'full'}")
        fig.suptitle(f"{scenario} · {dtype} · {mode}: TFLOP/s")
        fig.supxlabel(footer, fontsize=7)
        path = directory / f"{stem}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written


def draw_panel(ax, lines: dict[str, list[tuple[int, float]]], title: str) -> None:
    """TFLOP/s against sequence length on ``ax``: one line per provider (``lines`` maps a
    PROVIDERS name to its (seqlen, TFLOP/s) points), in that provider's colour everywhere."""
    for provider, points in lines.items():
        xs, ys = zip(*points)
        color = f"C{list(PROVIDERS).index(provider) % 10}"  # one colour per provider in every panel
        ax.plot(xs, ys, marker="o", color=color, label=PROVIDERS[provider].label,
                linewidth=2.5 if provider == "flashtile" else 1.2)
    ax.set_xscale("log", base=2)
    seqlens = sorted({x for points in lines.values() for x, _ in points})
    ax.set_xticks(seqlens, [_seqlen(n) for n in seqlens])
    ax.minorticks_off()
    ax.set_xlabel("sequence length")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
