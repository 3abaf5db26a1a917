"""Host (CPU) cost of one attention call against its GPU time: is a short problem launch-bound?

At seqlen 1k the d128 forward of 16k tokens runs for ~0.3 ms on an H200; when the Python
path from ``flashtile.attention`` to the kernel launch costs as much, the GPU waits on the
host and the speed table measures the host. The same holds for a varlen batch and for
decoding, which adds checks of its index tensors. Three figures per call, forward only:

- ``host``: wall time per call while the GPU is kept busy by a sleep kernel queued first,
  so calls are only enqueued (the host's own cost);
- ``timed``: do_bench's median, the speed table's figure (host and GPU overlapping);
- ``graph``: the same call replayed from a CUDA graph, which skips the host: the GPU's time.

``timed`` near ``host`` and well above ``graph`` means the call is launch-bound.

    python benchmarks/launch_overhead.py
    PYTHONPATH=.old/src python benchmarks/launch_overhead.py   # an older tree, for comparison
    python benchmarks/launch_overhead.py --device cpu --seqlen 64 --batch 2 --varlen 2 32 --decode-batches 2 \
        --cache 256   # smoke test (host only)
"""

from __future__ import annotations

import argparse
import time

import torch
from timing import graph_ms

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


def report(label: str, fn, device: torch.device, graphable: bool) -> None:
    fn()
    host = host_ms_per_call(fn, device)
    timed = median_ms(fn, device)
    graph, note = float("nan"), ""
    if device.type == "cuda" and graphable:
        try:
            graph = graph_ms(fn)
        except RuntimeError as err:  # a call that cannot be captured: say so, keep the other figures
            note = f"  (no graph: {str(err).splitlines()[0][:60]})"
    print(f"{label:34s} | {host:7.3f} {timed:7.3f} {graph:7.3f}{note}", flush=True)


def dense_cases(args, device):
    for seqlen in args.seqlen:
        batch = args.batch or max(1, 16384 // seqlen)
        for causal in (False, True):
            for grad in (False, True):  # with requires_grad the call also goes through autograd
                q, k, v = (torch.randn(batch, 16, seqlen, 128, device=device, dtype=torch.bfloat16,
                                       requires_grad=grad) for _ in range(3))
                yield (f"dense N={seqlen} causal={causal} grad={grad}",
                       lambda q=q, k=k, v=v, causal=causal: flashtile.attention(q, k, v, causal=causal, layout="bhsd"),
                       not grad)


def varlen_cases(args, device):
    # variants.py's varlen row: equal sequences packed, against the dense batch of the same tokens.
    seqs, seqlen = args.varlen
    cu = torch.arange(0, (seqs + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
    for grad in (False, True):
        q, k, v = (torch.randn(seqs * seqlen, 16, 128, device=device, dtype=torch.bfloat16, requires_grad=grad)
                   for _ in range(3))
        yield (f"varlen {seqs}x{seqlen} causal grad={grad}",
               lambda q=q, k=k, v=v: flashtile.flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=True),
               not grad)


def decode_cases(args, device):
    for batch in args.decode_batches:  # one new token against an 8k cache, 32 query heads over 8 KV heads
        q = torch.randn(batch, 1, 32, 128, device=device, dtype=torch.bfloat16)
        cache = torch.randn(batch, args.cache, 8, 128, device=device, dtype=torch.bfloat16)
        lens = torch.full((batch,), args.cache, dtype=torch.int32, device=device)
        yield (f"decode B={batch} cache={args.cache}",
               lambda q=q, cache=cache, lens=lens: flashtile.flash_attn_with_kvcache(q, cache, cache,
                                                                                    cache_seqlens=lens),
               True)
        # flash-attn's usual step: the new token's k and v written into the cache first.
        new = torch.randn(batch, 1, 8, 128, device=device, dtype=torch.bfloat16)
        yield (f"decode+append B={batch}",
               lambda q=q, cache=cache, lens=lens - 1, new=new: flashtile.flash_attn_with_kvcache(
                   q, cache, cache, new, new, cache_seqlens=lens),
               True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seqlen", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--batch", type=int, default=None, help="default: 16384 tokens / seqlen")
    p.add_argument("--varlen", type=int, nargs=2, default=[8, 2048], metavar=("SEQS", "SEQLEN"))
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--cache", type=int, default=8192)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}: bf16, headdim 128, forward, "
          f"ms per call")
    print(f"{'case':34s} | {'host':>7} {'timed':>7} {'graph':>7}")
    for cases in (dense_cases, varlen_cases, decode_cases):
        try:
            for label, fn, graphable in cases(args, device):
                report(label, fn, device, graphable)
        except AttributeError as err:  # an older tree (PYTHONPATH=old/src) without this face
            print(f"{cases.__name__}: not in this flashtile ({err})")


if __name__ == "__main__":
    main()
