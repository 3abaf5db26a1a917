"""The grid, the timing and the run loop of ``flashtile bench``.

Shapes follow the field's convention: batch × seqlen = 16384 tokens, hidden 2048,
heads = hidden / headdim. FLOPs come from the scenario: 4·B·H·N²·D for dense
attention, halved when causal; the backward counts 2.5× the forward.

Every provider runs every case in the same process. Per (case, provider):
the first forward (and first backward) call is timed on its own wall clock: on the
GPU that is where Triton compiles (and, with FLASHTILE_AUTOTUNE=1, tunes) the
kernels of a new shape class. Then each mode is timed: the median of
``triton.testing.do_bench`` on a GPU (it warms up and flushes L2 itself), the median
of a few ``time.perf_counter`` repetitions on the CPU. With ``rounds`` > 1 every case is
timed that many times, the providers in turn each round (so a drift of the machine's
clocks or host load falls on all of them alike), and each cell reports the median round.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .providers import Provider, Unsupported
from .scenarios import MODE_FLOPS, Scenario

MODES = tuple(MODE_FLOPS)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class Case:
    """One problem: (batch, heads, seqlen, headdim) of one scenario and dtype."""

    scenario: Scenario
    dtype: torch.dtype
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    heads: int

    @property
    def shape_class(self) -> tuple:
        """What a kernel is compiled for: everything but the sizes."""
        return (self.scenario.name, DTYPE_NAMES[self.dtype], self.headdim, self.causal)

    def describe(self) -> str:
        return (f"{self.scenario.name} {DTYPE_NAMES[self.dtype]} d={self.headdim} "
                f"{'causal' if self.causal else 'full'} N={self.seqlen}")


@dataclass(frozen=True)
class Grid:
    scenarios: tuple[Scenario, ...]
    dtypes: tuple[torch.dtype, ...]
    headdims: tuple[int, ...]
    causal: tuple[bool, ...]
    seqlens: tuple[int, ...]
    modes: tuple[str, ...]
    tokens: int = 16384
    hidden: int = 2048

    def cases(self) -> Iterator[Case]:
        # Seqlen innermost: the first case of a shape class is the one that compiles.
        for scenario in self.scenarios:
            for dtype in self.dtypes:
                for headdim in self.headdims:
                    for causal in self.causal:
                        for seqlen in self.seqlens:
                            yield Case(scenario, dtype, headdim, causal, seqlen,
                                       batch=max(1, self.tokens // seqlen), heads=max(1, self.hidden // headdim))


def flops(batch: int, heads: int, seqlen: int, headdim: int, causal: bool, mode: str = "fwd") -> float:
    """The convention's FLOPs of dense attention: 4·B·H·N²·D, halved when causal, × 2.5 backward."""
    return 4.0 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1) * MODE_FLOPS[mode]


# -- timing


class Timer:
    """Milliseconds of ``fn()``: do_bench's median on CUDA, a perf_counter median on the CPU."""

    def __init__(self, device: torch.device, *, cpu_reps: int = 3, warmup_ms: int = 25, rep_ms: int = 100,
                 rounds: int = 1):
        if rounds < 1:
            raise ValueError(f"rounds: expected 1 or more, got {rounds}")
        self.device = device
        self.cpu_reps = cpu_reps
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.rounds = rounds

    @property
    def method(self) -> str:
        if self.device.type == "cuda":
            text = f"triton.testing.do_bench median (warmup {self.warmup_ms} ms, rep {self.rep_ms} ms)"
        else:
            text = f"time.perf_counter median of {self.cpu_reps} after one warm-up call"
        if self.rounds > 1:
            text += f"; the median of {self.rounds} rounds, providers in turn"
        return text

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def once(self, fn: Callable[[], object]) -> tuple[object, float]:
        """One call on the wall clock, synchronized: (result, ms)."""
        self.sync()
        start = time.perf_counter()
        result = fn()
        self.sync()
        return result, (time.perf_counter() - start) * 1e3

    def median(self, fn: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        return statistics.median(self.once(fn)[1] for _ in range(self.cpu_reps))


# -- results


@dataclass
class Measurement:
    """One cell: a provider on a case in one mode.

    status: "ok", "unsupported" (not tried: device, scenario, memory estimate,
    missing package), "oom" or "error" (tried and raised). first_call_ms: the first
    call of this pass on this case (fwd+bwd: first forward + first backward).
    rounds_ms: with several rounds, each round's ms (``ms`` is their median).
    """

    provider: str
    case: Case
    mode: str
    status: str
    ms: float | None = None
    first_call_ms: float | None = None
    reason: str | None = None
    rounds_ms: list[float] | None = None

    @property
    def tflops(self) -> float | None:
        if self.ms is None:
            return None
        return self.case.scenario.flops(self.case, self.mode) / (self.ms * 1e-3) / 1e12

    def to_json(self) -> dict:
        c = self.case
        return {
            "scenario": c.scenario.name, "window": c.scenario.window, "documents": c.scenario.documents,
            "dtype": DTYPE_NAMES[c.dtype],
            "mode": self.mode, "headdim": c.headdim, "causal": c.causal, "seqlen": c.seqlen,
            "batch": c.batch, "heads": c.heads, "provider": self.provider, "status": self.status,
            "ms": self.ms, "tflops": self.tflops, "first_call_ms": self.first_call_ms,
            "flops": c.scenario.flops(c, self.mode), "reason": self.reason, "rounds_ms": self.rounds_ms,
        }


def speedup(mine: Measurement, other: Measurement) -> float:
    """``other``'s time over ``mine`` (> 1: ``mine`` is faster). Where both were timed in the
    same rounds (the providers in turn each round), the median of the rounds' own ratios: each
    pairs two times taken moments apart, so a drift of the machine between rounds cancels in
    it, where it need not in the ratio of the two medians (taken from different rounds)."""
    if mine.rounds_ms and other.rounds_ms and len(mine.rounds_ms) == len(other.rounds_ms):
        return statistics.median(theirs / ours for ours, theirs in zip(mine.rounds_ms, other.rounds_ms))
    return other.ms / mine.ms


_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def _reason(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return f"{type(err).__name__}: {text}"[:200]


def _failure(err: BaseException) -> tuple[str, str]:
    if isinstance(err, Unsupported):
        return "unsupported", str(err)
    if isinstance(err, _OUT_OF_MEMORY):
        return "oom", _reason(err)
    return "error", _reason(err)


def measure(provider: Provider, case: Case, modes: tuple[str, ...], device: torch.device,
            timer: Timer) -> list[Measurement]:
    """Every requested mode of ``provider`` on ``case``; failures become records."""
    backward_modes = [m for m in modes if m != "fwd"]
    results: dict[str, Measurement] = {}

    def fail(err: BaseException, which) -> None:
        status, reason = _failure(err)
        for mode in which:
            results.setdefault(mode, Measurement(provider.name, case, mode, status, reason=reason))

    def done() -> list[Measurement]:
        return [results[m] for m in modes]

    try:
        provider.check(case, device, backward=False)
        q, k, v = case.scenario.inputs(case, device)
        fn = provider.build(case, q, k, v)
        out, first_fwd = timer.once(fn)
    except Exception as err:  # noqa: BLE001 - a provider's failure is a result, not a crash
        fail(err, modes)
        return done()

    if "fwd" in modes:
        try:
            results["fwd"] = Measurement(provider.name, case, "fwd", "ok", timer.median(fn), first_fwd)
        except Exception as err:  # noqa: BLE001
            fail(err, ["fwd"])
    if not backward_modes:
        return done()
    try:
        provider.check(case, device, backward=True)  # the backward may not fit where the forward did
        inputs = (q, k, v)
        dout = torch.randn_like(out)
        _, first_bwd = timer.once(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))
        if "bwd" in modes:
            ms = timer.median(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))
            results["bwd"] = Measurement(provider.name, case, "bwd", "ok", ms, first_bwd)
        if "fwd+bwd" in modes:
            ms = timer.median(lambda: torch.autograd.grad(fn(), inputs, dout))
            results["fwd+bwd"] = Measurement(provider.name, case, "fwd+bwd", "ok", ms, first_fwd + first_bwd)
    except Exception as err:  # noqa: BLE001
        fail(err, backward_modes)
    return done()


@dataclass
class Run:
    measurements: list[Measurement] = field(default_factory=list)
    interrupted: bool = False


def combine_rounds(rounds: list[list[Measurement]]) -> list[Measurement]:
    """One provider's cells on one case from each round's (same modes, same order): a mode
    measured in every round gets the median round's ms and every round's (the first call is
    the first round's: later rounds start warm); one that failed in any round keeps the first
    failure."""
    if len(rounds) == 1:
        return rounds[0]
    combined = []
    for cells in zip(*rounds):
        failed = [m for m in cells if m.status != "ok"]
        if failed:
            combined.append(failed[0])
            continue
        times = [m.ms for m in cells]
        first = cells[0]
        combined.append(Measurement(first.provider, first.case, first.mode, "ok", statistics.median(times),
                                    first.first_call_ms, rounds_ms=times))
    return combined


def run_grid(grid: Grid, providers: list[Provider], device: torch.device, timer: Timer, *,
             on_start: Callable[[Case, Provider], None] | None = None,
             on_measured: Callable[[Case, Provider], None] | None = None,
             on_done: Callable[[Case, Provider, list[Measurement]], None] | None = None) -> Run:
    """All providers on all cases, ``timer.rounds`` times each case with the providers in turn;
    on_start and on_measured around each measurement, on_done with a provider's cells of a
    case once its rounds are in. Ctrl-C stops early and keeps what was measured (a case's
    rounds so far)."""
    run = Run()
    for case in grid.cases():
        rounds: dict[str, list[list[Measurement]]] = {provider.name: [] for provider in providers}
        try:
            for _ in range(timer.rounds):
                for provider in providers:
                    if on_start is not None:
                        on_start(case, provider)
                    results = measure(provider, case, grid.modes, device, timer)
                    rounds[provider.name].append(results)
                    if device.type == "cuda" and any(m.status == "oom" for m in results):
                        gc.collect()  # the failed cell's tensors are gone now: give their memory back
                        torch.cuda.empty_cache()
                    if on_measured is not None:
                        on_measured(case, provider)
        except KeyboardInterrupt:
            run.interrupted = True
        for provider in providers:
            if rounds[provider.name]:
                results = combine_rounds(rounds[provider.name])
                run.measurements.extend(results)
                if on_done is not None:
                    on_done(case, provider, results)
        if run.interrupted:
            break
    return run


# -- first-call cost


@dataclass(frozen=True)
class FirstCall:
    """A provider's first call in one shape class and pass, against its steady time.

    overhead_ms = first call − steady median: compile (and tuning) time, plus one-time
    set-up. later_max_ms: the largest such overhead on the class's later sizes
    (a recompile or a new tuning bucket per size shows there).
    """

    provider: str
    shape_class: tuple
    mode: str
    seqlen: int
    first_call_ms: float
    steady_ms: float
    later_max_ms: float | None

    @property
    def overhead_ms(self) -> float:
        return max(self.first_call_ms - self.steady_ms, 0.0)

    def to_json(self) -> dict:
        scenario, dtype, headdim, causal = self.shape_class
        return {"provider": self.provider, "scenario": scenario, "dtype": dtype, "headdim": headdim,
                "causal": causal, "mode": self.mode, "first_seqlen": self.seqlen,
                "first_call_ms": self.first_call_ms, "steady_ms": self.steady_ms,
                "overhead_ms": self.overhead_ms, "later_max_overhead_ms": self.later_max_ms}


def first_calls(measurements: list[Measurement]) -> list[FirstCall]:
    """Per provider, shape class and pass (fwd, bwd): the first call's cost, in run order."""
    groups: dict[tuple, list[Measurement]] = {}
    for m in measurements:
        if m.status == "ok" and m.mode in ("fwd", "bwd") and m.first_call_ms is not None:
            groups.setdefault((m.provider, m.case.shape_class, m.mode), []).append(m)
    rows = []
    for (provider, shape_class, mode), ms in groups.items():
        first, later = ms[0], ms[1:]
        later_max = max((max(m.first_call_ms - m.ms, 0.0) for m in later), default=None)
        rows.append(FirstCall(provider, shape_class, mode, first.case.seqlen, first.first_call_ms, first.ms,
                              later_max))
    return rows
