"""Host (CPU) cost of one attention call against its GPU time: is a short problem launch-bound?

At seqlen 1k the d128 forward runs for ~0.1 ms on an H200; if the Python path from
``flashtile.attention`` to the kernel launch costs as much, the GPU waits on the host and
the speed table measures the host. Three figures per problem, forward only:

- ``host``: wall time per call while the GPU is kept busy by a sleep kernel queued first,
  so calls are only enqueued (the host's own cost);
- ``timed``: do_bench's median, the speed table's figure (host and GPU overlapping);
- ``graph``: the same call replayed from a CUDA graph, which skips the host: the GPU's time.

``timed`` near ``host`` and well above ``graph`` means the call is launch-bound.

    python benchmarks/launch_overhead.py
    PYTHONPATH=.old/src python benchmarks/launch_overhead.py   # an older tree, for comparison
    python benchmarks/launch_overhead.py --device cpu --seqlen 64 --batch 2   # smoke test (host only)
"""

from __future__ import annotations

import argparse
import time

import torch

import flashtile


def median_ms(fn, device) -> float:
    # triton's do_bench directly on the GPU (not timing.py, whose harness an older flashtile
    # tree lacks: this script also times old trees, PYTHONPATH=old/src).
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=50, return_mode="median")
    from timing import median_ms as cpu_median_ms

    return cpu_median_ms(fn, device)


def host_ms_per_call(fn, device: torch.device, calls: int = 50) -> float:
    """Milliseconds the host spends per call, measured while the GPU is still busy."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e9))  # ~1 s of GPU cycles: every call below is only enqueued
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize()
    return elapsed / calls * 1e3


def graph_ms(fn) -> float:
    """GPU milliseconds of ``fn`` replayed from a CUDA graph (no host work per call)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up: compile and cache outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, "cuda")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seqlen", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--batch", type=int, default=None, help="default: 16384 tokens / seqlen")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}: bf16, 16 heads, headdim 128, "
          f"forward, ms per call")
    print(f"{'N':>6} {'causal':>6} {'grad':>5} | {'host':>7} {'timed':>7} {'graph':>7}")
    for seqlen in args.seqlen:
        batch = args.batch or max(1, 16384 // seqlen)
        for causal in (False, True):
            for grad in (False, True):  # with requires_grad the call also goes through autograd
                q, k, v = (torch.randn(batch, 16, seqlen, 128, device=device, dtype=torch.bfloat16,
                                       requires_grad=grad) for _ in range(3))

                def fn():
                    return flashtile.attention(q, k, v, causal=causal, layout="bhsd")

                fn()
                host = host_ms_per_call(fn, device)
                timed = median_ms(fn, device)
                graph = graph_ms(fn) if device.type == "cuda" and not grad else float("nan")
                print(f"{seqlen:6d} {str(causal):>6} {str(grad):>5} | {host:7.3f} {timed:7.3f} {graph:7.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
