"""Where the host's time goes in one attention call on a GPU: cProfile of the Python path.

    python benchmarks/probes/host_profile.py [--seqlen 1024] [--headdim 128] [--calls 40] [--docs 16]

d128 bf16, 16 heads, 16k tokens, causal; forward alone (no grad), forward with grad (the graph
recorded, as ``flashtile bench`` times it) and forward + backward.
``--calibrate`` (``--only-calibrate``: and nothing else) first prints the host time per call of
flashtile's causal forward with grad (what ``flashtile bench`` times; causal whatever ``--docs`` says)
beside SDPA's flash and cuDNN forwards of the same inputs: the host machine's speed apart from
flashtile's (the 1k causal cells' spread between device leases, session 22). ``--docs D`` masks it
instead with a mask_mod (causal and D documents of equal length) and a block mask of 128 x 128 tiles
built once, the path of masks.py's document rows.
The GPU is kept busy by a sleep kernel queued first, so calls only enqueue and the figures
are the host's own. Keep calls × launches per call under ~1000: past the driver's queue
depth a launch blocks until the sleep ends, and the profile then shows that wait.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys

import torch

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from launch_overhead import host_ms_per_call  # noqa: E402
from masks import causal_documents  # noqa: E402


def host_us(fn, calls: int) -> float:
    """Host microseconds per call of ``fn`` while the GPU is kept busy (launch_overhead's
    host_ms_per_call), the median of 5 rounds."""
    return statistics.median(host_ms_per_call(fn, torch.device("cuda"), calls) for _ in range(5)) * 1e3


def calibrate(q, k, v, calls: int) -> None:
    """Host us per forward call with grad, causal: flashtile.attention, then SDPA's flash and cuDNN
    backends on the same (B, H, S, D) views (each backend chosen outside the timed calls)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    cases = [("flashtile.attention", lambda: flashtile.attention(q, k, v, causal=True), contextlib.nullcontext())]
    for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
        cases.append((name, lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True),
                      sdpa_kernel(backend)))
    for name, fn, backend in cases:
        with backend:
            for _ in range(3):
                fn()
            print(f"calibrate: {name:22s} host {host_us(fn, calls):7.1f} us per forward call with grad", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--docs", type=int, default=0, help="a document mask of this many documents")
    parser.add_argument("--calibrate", action="store_true",
                        help="first: host us per forward call with grad, flashtile beside SDPA flash and cuDNN")
    parser.add_argument("--only-calibrate", action="store_true", help="--calibrate, then stop (no profiles)")
    args = parser.parse_args()
    batch, heads = 16384 // args.seqlen, 2048 // args.headdim
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))

    masking = {"causal": True}
    if args.docs:
        _, mask, block_mask = causal_documents(args.seqlen, args.docs, "cuda", block_n=128)
        masking = {"mask_mod": mask, "block_mask": block_mask}

    def forward():
        with torch.no_grad():
            flashtile.attention(q, k, v, **masking)

    def forward_with_grad():  # what flashtile bench's forward cells time
        flashtile.attention(q, k, v, **masking)

    def forward_backward():
        out = flashtile.attention(q, k, v, **masking)
        torch.autograd.grad(out, (q, k, v), out)

    if args.calibrate or args.only_calibrate:
        calibrate(q, k, v, args.calls)
        if args.only_calibrate:
            return
    for name, fn in (("forward", forward), ("forward with grad", forward_with_grad),
                     ("forward+backward", forward_backward)):
        for _ in range(3):
            fn()
        per_call = host_us(fn, args.calls)
        torch.cuda._sleep(int(1e9))
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        print(f"===== {name}: host {per_call:.1f} us per call (without the profiler, median of 5 rounds)")
        for order, count in (("tottime", 25), ("cumulative", 45)):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
            print(text.getvalue())


if __name__ == "__main__":
    main()
