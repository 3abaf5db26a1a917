"""The ``flashtile`` command (also ``python -m flashtile``).

    flashtile demo    flashtile against standard attention on one problem: agreement
                      with the float64 oracle, time and peak memory, and a long context
                      that standard attention could not hold
    flashtile info    versions, CUDA devices, backends and why one is unavailable
    flashtile bench   TFLOP/s of flashtile against what PyTorch ships, in one run
                      (--quick: a tiny grid, anywhere; see flashtile.bench)

CUDA is queried inside a command only, never at import.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table

from . import __version__
from .api import attention
from .backends import backend_status, requested_backend, select_backend, triton_status
from .bench import cli as bench_cli
from .masks import normalize_window
from .memory import track_peak_memory
from .reference import naive_attention, tiled_attention_forward
from .testing import max_error, relative_error, tolerance
from .validation import check_backend_limits

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# The embedded problem: a few seconds of work on a 2-core CPU, a real size on a GPU.
# The long context is forward-only; standard attention is never run there.
DEFAULTS = {
    "cpu": {"heads": 4, "seqlen": 1024, "headdim": 64, "dtype": "float32", "long_seqlen": 16384},
    "cuda": {"heads": 16, "seqlen": 4096, "headdim": 128, "dtype": "bfloat16", "long_seqlen": 65536},
}

# The reference backend's long-context run uses larger tiles than the API's default:
# the same algorithm and O(N·d) memory, with far fewer Python iterations.
LONG_CONTEXT_TILE = 512
CPU_TIMING_REPEATS = 3


@dataclass(frozen=True)
class Problem:
    device: torch.device
    batch: int
    heads: int
    seqlen: int
    headdim: int
    dtype: torch.dtype
    causal: bool

    def inputs(self, seqlen: int, *, requires_grad: bool) -> list[torch.Tensor]:
        """Fresh random q, k, v: (batch, seqlen, heads, headdim)."""
        shape = (self.batch, seqlen, self.heads, self.headdim)
        return [
            torch.randn(shape, device=self.device, dtype=self.dtype).requires_grad_(requires_grad) for _ in range(3)
        ]

    def standard_attention_bytes(self, seqlen: int) -> int:
        """What standard attention holds at least: S and P, (batch, heads, seqlen, seqlen) each."""
        return 2 * self.batch * self.heads * seqlen * seqlen * self.dtype.itemsize


@dataclass(frozen=True)
class Agreement:
    tensor: str
    flashtile_max: float
    flashtile_rel: float
    standard_max: float
    standard_rel: float
    bound: float

    @property
    def passed(self) -> bool:
        return self.flashtile_max <= self.bound


@dataclass(frozen=True)
class Cost:
    name: str
    seqlen: int
    passes: str
    seconds: float | None
    peak_bytes: int | None
    computed_bytes: int | None = None


# -- measuring


def measure_seconds(fn: Callable[[], object], device: torch.device, *, repeats: int) -> float:
    """Median time of ``fn()``: CUDA events via triton's do_bench on a GPU, wall clock on the CPU.

    The caller has run ``fn`` once already (warm-up: first-call dispatch, compilation).
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median") / 1e3
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    with track_peak_memory(device) as peak:
        fn()
    return peak.peak_bytes


def forward_backward(attn, q, k, v, dout) -> Callable[[], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
    def run():
        out = attn(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    return run


def check_agreement(problem: Problem, flashtile_run, standard_run, q, k, v, dout) -> list[Agreement]:
    """Both implementations against the float64 oracle, under the numerical contract."""
    ft_out, ft_grads = flashtile_run()
    std_out, std_grads = standard_run()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    oracle = forward_backward(
        lambda q_, k_, v_: naive_attention(q_, k_, v_, causal=problem.causal, upcast=True), q64, k64, v64,
        dout.double(),
    )
    true_out, true_grads = oracle()
    rows = []
    for name, ft, std, truth in zip(
        ("out", "dq", "dk", "dv"), (ft_out, *ft_grads), (std_out, *std_grads), (true_out, *true_grads)
    ):
        standard_max = max_error(std, truth)
        rows.append(Agreement(
            name, max_error(ft, truth), relative_error(ft, truth), standard_max, relative_error(std, truth),
            tolerance(standard_max, grad=name != "out"),
        ))
    return rows


def long_context_backend(device: torch.device, backend: str) -> str:
    # Triton's interpreter (triton on CPU tensors) is for tests: far too slow for a long context.
    return "triton" if backend == "triton" and device.type == "cuda" else "reference"


def long_context_forward(problem: Problem, backend: str, q, k, v) -> Callable[[], object]:
    if backend == "triton":
        return lambda: attention(q, k, v, causal=problem.causal)
    # The reference backend's own loop, with larger tiles than the API's default.
    band = normalize_window(problem.causal, (-1, -1))
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views
    scale = problem.headdim ** -0.5
    return lambda: tiled_attention_forward(
        q_, k_, v_, scale, band, BLOCK_M=LONG_CONTEXT_TILE, BLOCK_N=LONG_CONTEXT_TILE
    )


# -- formatting


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def agreement_table(rows: list[Agreement], dtype_name: str) -> Table:
    table = Table(
        title="Agreement with the float64 oracle: max abs error / relative error",
        caption=f"standard: naive_attention in {dtype_name}, materialising S and P. "
        "bound: 2× (gradients 3×) standard's max error + 1e-5.",
        caption_justify="left",
    )
    table.add_column("tensor")
    table.add_column("flashtile", justify="right")
    table.add_column("standard", justify="right")
    table.add_column("bound", justify="right")
    table.add_column("verdict")
    for r in rows:
        table.add_row(
            r.tensor,
            f"{r.flashtile_max:.2e} / {r.flashtile_rel:.1e}",
            f"{r.standard_max:.2e} / {r.standard_rel:.1e}",
            f"{r.bound:.2e}",
            "[green]pass[/]" if r.passed else "[bold red]FAIL[/]",
        )
    return table


def cost_table(rows: list[Cost], timer: str, note: str | None) -> Table:
    table = Table(title=f"Time ({timer}) and peak extra memory", caption=note, caption_justify="left")
    table.add_column("run")
    table.add_column("seqlen", justify="right")
    table.add_column("pass")
    table.add_column("time", justify="right")
    table.add_column("peak extra memory", justify="right")
    for r in rows:
        if r.peak_bytes is not None:
            memory = format_bytes(r.peak_bytes)
        else:
            memory = f"≥ {format_bytes(r.computed_bytes)} (computed)"
        table.add_row(
            r.name, str(r.seqlen), r.passes, format_seconds(r.seconds) if r.seconds is not None else "not run", memory
        )
    return table


def long_context_note(backend: str) -> str:
    tiles = f" with {LONG_CONTEXT_TILE}×{LONG_CONTEXT_TILE} tiles" if backend == "reference" else ""
    return (
        f"Long context: forward only, flashtile's {backend} backend{tiles}. Standard attention is not "
        "run there: its memory is the size of S and P alone."
    )


def why_backend(device: torch.device, backend: str) -> str:
    requested = requested_backend()
    if requested != "auto":
        return f"FLASHTILE_BACKEND={requested}"
    if device.type != "cuda":
        return "auto: CPU tensors run the tiled PyTorch algorithm"
    if backend == "triton":
        return "auto: Triton kernels for CUDA tensors"
    return f"auto: Triton unavailable: {triton_status(device).reason}"


# -- commands


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser, console: Console) -> int:
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available (torch.cuda.is_available() is False)")
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    defaults = DEFAULTS[device_type]
    dtype_name = args.dtype or defaults["dtype"]
    problem = Problem(
        device=torch.device(device_type),
        batch=args.batch,
        heads=args.heads or defaults["heads"],
        seqlen=args.seqlen or defaults["seqlen"],
        headdim=args.headdim or defaults["headdim"],
        dtype=DTYPES[dtype_name],
        causal=args.causal,
    )
    long_seqlen = defaults["long_seqlen"] if args.long_seqlen is None else args.long_seqlen
    try:
        backend = select_backend(problem.device, problem.dtype)
        check_backend_limits(backend, problem.dtype, problem.headdim)
    except (RuntimeError, ValueError, TypeError) as err:
        console.print(f"[bold red]error:[/] {err}")
        return 2

    if device_type == "cuda":
        where, timer = torch.cuda.get_device_name(problem.device), "CUDA events, do_bench median"
    else:
        where, timer = f"CPU, {torch.get_num_threads()} threads", f"wall clock, median of {CPU_TIMING_REPEATS}"
    console.print(
        f"[bold]flashtile demo[/] · {'causal' if problem.causal else 'full'} · batch {problem.batch}, "
        f"heads {problem.heads}, seqlen {problem.seqlen}, headdim {problem.headdim} · {dtype_name}"
    )
    console.print(f"device: {where}; backend: [bold]{backend}[/] ({why_backend(problem.device, backend)})")

    torch.manual_seed(args.seed)
    q, k, v = problem.inputs(problem.seqlen, requires_grad=True)
    dout = torch.randn_like(q)
    flashtile_run = forward_backward(lambda *t: attention(*t, causal=problem.causal), q, k, v, dout)
    standard_run = forward_backward(
        lambda *t: naive_attention(*t, causal=problem.causal, upcast=False), q, k, v, dout
    )
    agreement = check_agreement(problem, flashtile_run, standard_run, q, k, v, dout)

    costs = []
    for name, run in (("flashtile", flashtile_run), ("standard attention", standard_run)):
        peak = measure_peak_bytes(run, problem.device)
        seconds = measure_seconds(run, problem.device, repeats=CPU_TIMING_REPEATS)
        costs.append(Cost(name, problem.seqlen, "fwd+bwd", seconds, peak))

    note = None
    if long_seqlen > 0:
        long_backend = long_context_backend(problem.device, backend)
        long_run = long_context_forward(problem, long_backend, *problem.inputs(long_seqlen, requires_grad=False))
        with torch.no_grad():
            long_peak = measure_peak_bytes(long_run, problem.device)  # also the warm-up
            seconds = measure_seconds(long_run, problem.device, repeats=1)
        standard_bytes = problem.standard_attention_bytes(long_seqlen)
        costs.append(Cost("flashtile", long_seqlen, "fwd", seconds, long_peak))
        costs.append(Cost("standard attention", long_seqlen, "fwd", None, None, standard_bytes))
        note = long_context_note(long_backend)

    console.print(agreement_table(agreement, dtype_name))
    console.print(cost_table(costs, timer, note))
    failed = [r.tensor for r in agreement if not r.passed]
    if failed:
        console.print(f"[bold red]agreement: FAIL[/] on {', '.join(failed)}: flashtile's error exceeds the bound")
    else:
        console.print("[bold green]agreement: pass[/] on out, dq, dk, dv, within the numerical contract")
    if long_seqlen > 0:
        console.print(
            f"memory at seqlen {long_seqlen}: flashtile {format_bytes(long_peak)} (measured), "
            f"standard attention ≥ {format_bytes(standard_bytes)} ({standard_bytes / max(long_peak, 1):.0f}×)"
        )
    return 1 if failed else 0


def _installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cmd_info(args: argparse.Namespace, parser: argparse.ArgumentParser, console: Console) -> int:
    versions = Table(title="Versions", show_header=False)
    versions.add_column("name")
    versions.add_column("value")
    versions.add_row("flashtile", __version__)
    versions.add_row("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
    versions.add_row("triton", _installed_version("triton"))
    versions.add_row("python", f"{platform.python_version()} ({sys.executable})")
    versions.add_row("platform", platform.platform())
    console.print(versions)

    devices = Table(title="CUDA devices")
    for column in ("index", "name", "capability", "memory"):
        devices.add_column(column)
    cuda = torch.cuda.is_available()
    if cuda:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.add_row(str(i), props.name, f"{props.major}.{props.minor}", format_bytes(props.total_memory))
    else:
        devices.add_row("-", "none (torch.cuda.is_available() is False)", "", "")
    console.print(devices)

    backends = Table(title="Backends")
    for column in ("backend", "available", "why"):
        backends.add_column(column)
    for status in backend_status():
        backends.add_row(status.name, "[green]yes[/]" if status.available else "[red]no[/]", status.reason)
    try:
        from .kernels import hopper

        gluon, why = hopper.availability()
    except ImportError as err:  # no Triton here
        gluon, why = False, f"needs Triton ({err})"
    backends.add_row("triton: Hopper kernels (Gluon)", "[green]yes[/]" if gluon else "[red]no[/]", why)
    console.print(backends)

    env = Table(title="Environment", show_header=False)
    env.add_column("name")
    env.add_column("value")
    switches = (("FLASHTILE_BACKEND", "unset (auto)"), ("TRITON_INTERPRET", "unset"),
                ("FLASHTILE_GLUON", "unset (auto: Gluon forward on sm_90 where measured faster)"),
                ("FLASHTILE_GLUON_BWD", "unset (auto: Gluon backward on sm_90, d64, d128 and d256)"),
                ("FLASHTILE_GLUON_BWD_FUSED",
                 "unset (auto: five products at d64, d128 where measured faster; 1: at every length; "
                 "before Triton 3.8 the reduction is a TMA store rewritten in the PTX)"),
                ("FLASHTILE_GLUON_BWD_TAIL",
                 "unset (auto: off, measured slower; 1: a non-causal five-product grid's last wave in parts)"),
                ("FLASHTILE_GLUON_BWD_HOIST_STATS",
                 "unset (auto: at d128, and d64 causal, the fused backward loads each step's lse2 row "
                 "during its S product)"),
                ("FLASHTILE_GLUON_BWD_DEFER_DK",
                 "unset (auto: at d64, and d128 causal, the fused backward's dK product stays in flight "
                 "through its consumers' meeting)"),
                ("FLASHTILE_GLUON_BWD_EXP_POLY",
                 "unset (auto: none; 1, 2: of every 4 of the fused backward's exponentials, on the FMA units)"),
                ("FLASHTILE_GLUON_DQ_SWIZZLE",
                 "unset (128: the five-product backward's dQ staging swizzle in bytes; 0, 32, 64 measured slower)"),
                ("FLASHTILE_GLUON_FWD_CONSUMERS",
                 "unset (auto: three consumer warpgroups at d64, two elsewhere; 2: two everywhere; 4: four "
                 "at d64, 256-row tiles)"),
                ("FLASHTILE_GLUON_FWD_PERSISTENT",
                 "unset (auto: persistent forward programs for causal rows (d256 past 1k keys; on a dynamic "
                 "scheduler past 1k keys) and non-causal d64 and d128 to 4k keys; 0: a program per Q tile; "
                 "1: always)"),
                ("FLASHTILE_GLUON_DQ_STATS",
                 "unset (auto: the dQ kernels write the backward's row stats up to 4k keys and under block masks, "
                 "a preprocess launch beyond; 1: always the dQ kernels)"))
    for name, unset in switches:
        env.add_row(name, os.environ.get(name, unset))
    for device_type in ("cpu", "cuda") if cuda else ("cpu",):
        try:
            chosen = select_backend(torch.device(device_type), torch.float32)
        except (RuntimeError, ValueError) as err:
            chosen = f"[red]error: {err}[/]"
        env.add_row(f"{device_type.upper()} tensors run on", chosen)
    console.print(env)
    return 0


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser, console: Console) -> int:
    return bench_cli.run(args, parser, console)


# -- argument parsing


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashtile", description="Exact, IO-aware attention (FlashAttention) for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"flashtile {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,info,bench}")

    demo = commands.add_parser(
        "demo",
        help="flashtile against standard attention: agreement, time, memory",
        description="Run flashtile and standard attention on one problem (defaults depend on the device), "
        "check both against the float64 oracle, and show time and peak memory, plus a long context "
        "where only flashtile runs.",
    )
    positive = _int_at_least(1)

    def by_device(key: str) -> str:
        return f"default: {DEFAULTS['cpu'][key]} on CPU, {DEFAULTS['cuda'][key]} on GPU"

    demo.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if a GPU is available, else cpu")
    demo.add_argument("--batch", type=positive, default=1, help="default: 1")
    demo.add_argument("--heads", type=positive, help=by_device("heads"))
    demo.add_argument("--seqlen", type=positive, help=by_device("seqlen"))
    demo.add_argument("--headdim", type=positive, help=by_device("headdim"))
    demo.add_argument("--dtype", choices=tuple(DTYPES), help=by_device("dtype"))
    demo.add_argument(
        "--long-seqlen", type=_int_at_least(0),
        help=f"forward-only long-context run, 0 to skip; {by_device('long_seqlen')}",
    )
    demo.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True, help="default: causal")
    demo.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default: 0)")
    demo.set_defaults(handler=cmd_demo)

    info = commands.add_parser("info", help="versions, CUDA devices, backends and why one is unavailable")
    info.set_defaults(handler=cmd_info)

    bench = commands.add_parser("bench", help="TFLOP/s against SDPA, FlexAttention and others; first-call cost",
                                description=bench_cli.DESCRIPTION)
    bench_cli.add_arguments(bench)
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.handler(args, parser, Console())
