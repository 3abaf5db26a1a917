"""Median wall time of a call for the benchmark scripts: the bench harness's own timer.

``flashtile.bench.harness.Timer`` uses triton's do_bench on a GPU and a perf_counter
median on the CPU. The scripts run on the CPU only as smoke tests (tiny sizes, CI):
there the numbers mean nothing, but every code path runs before GPU time is spent.
"""

from __future__ import annotations

import torch


def median_ms(fn, device: torch.device | str, warmup: int = 10, rep: int = 50) -> float:
    """Median milliseconds of ``fn()``; ``warmup``/``rep`` are do_bench's (ms) on CUDA."""
    # (imported here: graph_ms also serves scripts that time older flashtile trees, which lack the harness)
    from flashtile.bench.harness import Timer

    return Timer(torch.device(device), warmup_ms=warmup, rep_ms=rep).median(fn)


def capture(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` calls of ``fn``, after three warm-up calls on a side stream
    (compiles and caches stay outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def graph_ms(fn) -> float:
    """GPU milliseconds of ``fn`` replayed from a CUDA graph (no host work per call)."""
    graph = capture(fn)
    from triton.testing import do_bench

    return do_bench(graph.replay, warmup=10, rep=50, return_mode="median")
