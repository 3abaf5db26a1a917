"""``flashtile bench``: arguments, defaults and the command itself.

Also runnable as ``python benchmarks/run_bench.py`` (same flags). Lists take spaces or
commas: ``--seqlens 1k 4k 16k`` or ``--seqlens 1024,4096``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from typing import Callable, Iterator

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .environ import environment
from .harness import DTYPES, MODES, Grid, Timer, first_calls, run_grid
from .providers import DEFAULT_PROVIDERS, PROVIDERS
from .report import collect_meta, matplotlib_missing, print_report, to_json, write_json, write_plots
from .scenarios import SCENARIOS

# The full grid: the field's convention (PERFORMANCE.md). fwd+bwd and fp16 on request.
FULL = {
    "headdims": [64, 128, 256], "seqlens": [512, 1024, 2048, 4096, 8192, 16384], "causal": "both",
    "modes": ["fwd", "bwd"], "dtypes": ["bf16"], "scenarios": ["dense"], "tokens": 16384, "hidden": 2048,
    "window": 1024, "documents": 8,
}
# --quick: a smoke test. On the CPU a few seconds of tiny problems through every path
# (every scenario, every mode); on a GPU two real sizes of the grid.
QUICK = {
    "cpu": {"headdims": [64], "seqlens": [128, 256], "causal": "both", "modes": list(MODES), "dtypes": ["bf16"],
            "scenarios": ["dense", "sliding-window", "document"], "tokens": 1024, "hidden": 256, "window": 64,
            "documents": 3},
    "cuda": {"headdims": [128], "seqlens": [1024, 4096], "causal": "both", "modes": ["fwd", "bwd"],
             "dtypes": ["bf16"], "scenarios": ["dense"], "tokens": 16384, "hidden": 2048, "window": 1024,
             "documents": 8},
}
CAUSAL = {"yes": (True,), "no": (False,), "both": (False, True)}


def _size(text: str) -> int:
    """An integer, with k = 1024: 512, 1k, 16k."""
    try:
        value = int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer such as 512 or 16k, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("grid (default: the field's convention; see --quick)")
    g.add_argument("--quick", action="store_true",
                   help="a tiny grid that runs anywhere, the CPU included (a smoke test)")
    g.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if a GPU is available, else cpu")
    g.add_argument("--headdims", nargs="+", metavar="D", help=f"default: {' '.join(map(str, FULL['headdims']))}")
    g.add_argument("--seqlens", nargs="+", metavar="N", help="default: 512 1k 2k 4k 8k 16k (32k works too)")
    g.add_argument("--causal", choices=tuple(CAUSAL), help="default: both")
    g.add_argument("--modes", nargs="+", metavar="MODE", help=f"of {', '.join(MODES)}; default: fwd bwd")
    g.add_argument("--dtypes", nargs="+", metavar="DTYPE", help=f"of {', '.join(DTYPES)}; default: bf16")
    g.add_argument("--providers", nargs="+", metavar="NAME",
                   help=f"of {', '.join(PROVIDERS)}; default: all (on a GPU all but 'sdpa', SDPA's own choice)")
    g.add_argument("--scenario", nargs="+", dest="scenarios", metavar="NAME",
                   help=f"of {', '.join(SCENARIOS)}; default: dense")
    g.add_argument("--window", type=int, help="keys on each side for sliding-window (default: 1024)")
    g.add_argument("--documents", type=int, help="packed documents per sequence for document (default: 8)")
    g.add_argument("--tokens", type=_size, help="batch × seqlen (default: 16k; batch is at least 1)")
    g.add_argument("--hidden", type=_size, help="heads × headdim (default: 2048)")
    g.add_argument("--rounds", type=_rounds, default=1, metavar="R",
                   help="time every case R times, the providers in turn each round, and report each cell's "
                        "median round (every round's time goes to the JSON); default 1")
    o = parser.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write every cell and the run's metadata (rewritten as it runs)")
    o.add_argument("--plot-dir", metavar="DIR", help="write a PNG per panel (needs matplotlib)")
    o.add_argument("--cold-cache", action="store_true",
                   help="compile into fresh Triton/Inductor/flashtile caches, so first calls show the full "
                        "compile (and tuning) cost of a new machine")


def _rounds(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _listed(values: list[str] | None, default: list, parse, name: str, parser) -> list:
    if values is None:
        return list(default)
    items = [item for value in values for item in value.split(",") if item]
    try:
        return [parse(item) for item in items]
    except (ValueError, argparse.ArgumentTypeError, KeyError) as err:
        parser.error(f"--{name}: {err}")


def _choice(choices) -> Callable[[str], str]:
    def parse(item: str):
        if item not in choices:
            raise ValueError(f"{item!r} is not one of {', '.join(choices)}")
        return item

    return parse


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Grid, list[str], torch.device]:
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available (torch.cuda.is_available() is False)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    defaults = QUICK[device.type] if args.quick else FULL
    if device.type == "cpu" and not args.quick and args.seqlens is None:
        parser.error("the full grid is sized for a GPU (16k tokens per problem): on the CPU use --quick, "
                     "or choose --seqlens (and --tokens, --hidden) yourself")
    window = defaults["window"] if args.window is None else args.window
    try:
        documents = defaults["documents"] if args.documents is None else args.documents
        scenarios = [SCENARIOS[name](window=window, documents=documents)
                     for name in _listed(args.scenarios, defaults["scenarios"], _choice(SCENARIOS), "scenario", parser)]
    except ValueError as err:
        parser.error(str(err))
    grid = Grid(
        scenarios=tuple(scenarios),
        dtypes=tuple(DTYPES[d] for d in _listed(args.dtypes, defaults["dtypes"], _choice(DTYPES), "dtypes", parser)),
        headdims=tuple(_listed(args.headdims, defaults["headdims"], _size, "headdims", parser)),
        causal=CAUSAL[args.causal or defaults["causal"]],
        seqlens=tuple(_listed(args.seqlens, defaults["seqlens"], _size, "seqlens", parser)),
        modes=tuple(_listed(args.modes, defaults["modes"], _choice(MODES), "modes", parser)),
        tokens=args.tokens or defaults["tokens"],
        hidden=args.hidden or defaults["hidden"],
    )
    providers = _listed(args.providers, DEFAULT_PROVIDERS[device.type], _choice(PROVIDERS), "providers", parser)
    return grid, list(dict.fromkeys(providers)), device


@contextlib.contextmanager
def fresh_compile_caches(enabled: bool) -> Iterator[None]:
    """Point Triton's, Inductor's and flashtile's on-disk caches at an empty directory.

    Read when kernels compile, so this works as long as nothing compiled earlier in
    the process (kernels compiled in memory stay compiled)."""
    if not enabled:
        yield
        return
    names = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHTILE_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="flashtile-bench-cache-") as root, \
            environment({name: os.path.join(root, name.split("_")[0].lower()) for name in names}):
        yield


def _flashtile_backend(device: torch.device, dtype: torch.dtype) -> str:
    from ..backends import select_backend

    try:
        return select_backend(device, dtype)
    except (RuntimeError, ValueError) as err:
        return f"unavailable ({err})"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, console: Console) -> int:
    grid, providers, device = resolve(args, parser)
    if args.plot_dir and (missing := matplotlib_missing()):
        parser.error(f"--plot-dir: {missing}")
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)  # a CI log: wide tables rather than truncated columns
    with _cpu_threads(1 if device.type == "cpu" and args.quick else None):
        return _run(args, grid, providers, device, console)


@contextlib.contextmanager
def _cpu_threads(n: int | None) -> Iterator[None]:
    """--quick on the CPU runs one thread: on a shared 2-core CI machine, oversubscribed
    threads made the same smoke run 6× slower and its times meaningless."""
    if n is None:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _run(args, grid: Grid, providers: list[str], device: torch.device, console: Console) -> int:
    timer = Timer(device, cpu_reps=3 if args.quick else 5, rounds=args.rounds)
    torch.manual_seed(0)
    meta = collect_meta(device, grid, timer, _flashtile_backend(device, grid.dtypes[0]), args.cold_cache)
    threads = meta.get("cpu_threads")
    where = meta["gpu"] or f"CPU, {threads} thread{'' if threads == 1 else 's'}"
    cases = list(grid.cases())
    console.print(f"[bold]flashtile bench[/]{' --quick' if args.quick else ''} · {where} · torch {meta['torch']} · "
                  f"triton {meta['triton']} · flashtile backend: {meta['flashtile_backend']}")
    console.print(f"{len(cases)} cases × {len(providers)} providers · modes {', '.join(grid.modes)} · "
                  f"{grid.tokens} tokens, hidden {grid.hidden} · {timer.method}")

    measurements = []

    def save(complete: bool) -> None:
        if args.json:
            write_json(args.json, to_json(meta, grid, providers, measurements, first_calls(measurements),
                                          complete=complete))

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with fresh_compile_caches(args.cold_cache), Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting", total=len(cases) * len(providers) * timer.rounds)

        def on_start(case, provider):
            bar.update(task, description=f"{case.describe()} · {provider.name}")

        def on_measured(case, provider):
            bar.advance(task)

        def on_done(case, provider, results):
            measurements.extend(results)
            save(complete=False)

        outcome = run_grid(grid, [PROVIDERS[p] for p in providers], device, timer, on_start=on_start,
                           on_measured=on_measured, on_done=on_done)

    calls = first_calls(measurements)
    print_report(console, measurements, providers, calls, cold_cache=args.cold_cache)
    save(complete=not outcome.interrupted)
    if args.json:
        console.print(f"wrote {args.json}")
    if args.plot_dir:
        paths = write_plots(args.plot_dir, measurements, providers, meta)
        console.print(f"wrote {len(paths)} plots to {args.plot_dir}")
    if outcome.interrupted:
        console.print("[yellow]interrupted[/]: the report holds the cells measured so far")
        return 130
    broken = [m for m in measurements if m.provider == "flashtile" and m.status in ("error", "oom")]
    if broken:
        console.print(f"[bold red]flashtile failed on {len(broken)} cells[/] (see 'Cells not measured')")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashtile bench", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser, Console())


DESCRIPTION = (
    "TFLOP/s of flashtile against PyTorch's attention backends, FlexAttention, naive attention and "
    "flash-attn, all in one process: forward, backward, forward+backward; first-call (compile) cost; "
    "a console table, JSON and PNG plots."
)
