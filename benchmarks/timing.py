"""Median wall time of a call: triton's do_bench on a GPU, a plain timer on the CPU.

The benchmark scripts run on the CPU only as smoke tests (tiny sizes, CI): there the
numbers mean nothing, but every code path of the script runs before GPU time is spent.
"""

from __future__ import annotations

import statistics
import time

import torch


def median_ms(fn, device: torch.device | str, warmup: int = 10, rep: int = 50) -> float:
    """Median milliseconds of ``fn()``; ``warmup``/``rep`` are do_bench's (ms) on CUDA."""
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
