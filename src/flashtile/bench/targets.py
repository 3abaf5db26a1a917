"""The speed targets (docs/performance.md, from the project's brief), checked on a run's own cells.

- dense, bf16, head dim 128, N = 16k, forward and backward: ≥ 1.0× SDPA's cuDNN backend;
- every dense cell of the grid: ≥ 1.6× SDPA's flash backend (FA2) and ≥ 1.2× FlexAttention.

A ratio is the other provider's time over flashtile's on the same case and pass of the same
run (> 1: flashtile faster; with ``--rounds``, the median of the rounds' ratios:
harness.speedup). A target is reported only for the cells where both providers have a time; a
run without the provider, or without a qualifying cell, leaves that target out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .harness import DTYPE_NAMES, Measurement, speedup


@dataclass(frozen=True)
class Target:
    """flashtile ≥ ``ratio`` × ``provider`` on every cell where ``applies`` (flashtile's cell) holds."""

    description: str
    provider: str
    ratio: float
    applies: Callable[[Measurement], bool]


def _dense_bf16(m: Measurement) -> bool:
    return m.case.scenario.name == "dense" and DTYPE_NAMES[m.case.dtype] == "bf16" and m.mode in ("fwd", "bwd")


TARGETS = (
    Target("d128, N = 16k: ≥ 1.0× SDPA cuDNN", "sdpa-cudnn", 1.0,
           lambda m: _dense_bf16(m) and m.case.headdim == 128 and m.case.seqlen == 16384),
    Target("every dense cell: ≥ 1.6× SDPA flash (FA2)", "sdpa-flash", 1.6, _dense_bf16),
    Target("every dense cell: ≥ 1.2× FlexAttention", "flex", 1.2, _dense_bf16),
)


@dataclass
class TargetResult:
    """How one target fared: the cells compared, how many met it, and the worst of them."""

    target: Target
    cells: int
    met: int
    worst_ratio: float
    worst_cell: str

    @property
    def holds(self) -> bool:
        return self.met == self.cells


def _cell_name(m: Measurement) -> str:
    c = m.case
    return f"d{c.headdim} {'causal' if c.causal else 'full'} N={c.seqlen} {m.mode}"


def check(measurements: list[Measurement], targets=TARGETS) -> list[TargetResult]:
    """Each target with at least one comparable cell, in ``targets``' order."""
    timed = {(m.provider, m.case, m.mode): m for m in measurements if m.status == "ok" and m.ms}
    results = []
    for target in targets:
        ratios = []
        for (provider, case, mode), mine in timed.items():
            if provider != "flashtile" or not target.applies(mine):
                continue
            other = timed.get((target.provider, case, mode))
            if other is not None:
                ratios.append((speedup(mine, other), _cell_name(mine)))
        if ratios:
            worst, where = min(ratios)
            results.append(TargetResult(target, len(ratios), sum(r >= target.ratio for r, _ in ratios), worst, where))
    return results
