"""Median wall time of a call for the benchmark scripts: the bench harness's own timer.

``flashtile.bench.harness.Timer`` uses triton's do_bench on a GPU and a perf_counter
median on the CPU. The scripts run on the CPU only as smoke tests (tiny sizes, CI):
there the numbers mean nothing, but every code path runs before GPU time is spent.
"""

from __future__ import annotations

import torch

from flashtile.bench.harness import Timer


def median_ms(fn, device: torch.device | str, warmup: int = 10, rep: int = 50) -> float:
    """Median milliseconds of ``fn()``; ``warmup``/``rep`` are do_bench's (ms) on CUDA."""
    return Timer(torch.device(device), warmup_ms=warmup, rep_ms=rep).median(fn)
