"""Host time of short calls with kernels/fast_launch.py on and off (an A/B in one process).

    python benchmarks/probes/fast_launch.py [--seqlen 1024] [--headdims 128 64 256] [--launch-only]

First the launch alone: host microseconds per hopper.forward call, on and off, 7 x 100 calls.
Then the API's calls:
bf16, 16k tokens, H = 2048 / d, causal and not; per case: the forward alone (no grad) and the
backward alone (torch.autograd.grad of one forward's output, graph kept). Three figures per
call (launch_overhead.py's): host ms per call while the GPU is busy, do_bench's median (the
speed table's figure), and TFLOP/s from that median. Before timing, each case's outputs with
the path on and off are compared bit for bit (same kernels, same inputs: a difference would
mean the direct launch ran something else; the backward is compared under
deterministic=True, since the five-product kernel's dQ may differ in its last bits).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import flashtile
from flashtile.kernels import fast_launch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from launch_overhead import host_ms_per_call, median_ms  # noqa: E402


def flops(batch, heads, seqlen, head_dim, causal, backward):
    total = 4 * batch * heads * seqlen * seqlen * head_dim * (2.5 if backward else 1.0)
    return total / 2 if causal else total


def launches_alone(calls: int = 100, repeats: int = 7) -> None:
    """Host microseconds per hopper.forward call (one Gluon launch, its descriptors and LSE
    buffer; d128, 16 x 1k) with the compiled-kernel path on and off, the GPU kept busy so that
    calls only enqueue: the launch's own cost, apart from the rest of the API's host path, whose
    scatter between runs on this machine is larger than the difference."""
    from flashtile.kernels import hopper

    q, k, v, out = (torch.randn(16, 16, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    figures = {True: [], False: []}
    for _ in range(repeats):
        for enabled in (True, False):
            fast_launch.ENABLED = enabled
            hopper.forward(q, k, v, out, 128 ** -0.5, False)
            torch.cuda.synchronize()
            torch.cuda._sleep(int(5e8))
            start = time.perf_counter()
            for _ in range(calls):
                hopper.forward(q, k, v, out, 128 ** -0.5, False)
            figures[enabled].append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    for enabled in (True, False):
        values = sorted(figures[enabled])
        print(f"hopper.forward host us per call, fast path {'on ' if enabled else 'off'}: "
              f"min {values[0]:.1f} median {values[len(values) // 2]:.1f} (of {repeats} x {calls} calls)")
    fast_launch.ENABLED = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--headdims", type=int, nargs="+", default=[128, 64, 256])
    parser.add_argument("--launch-only", action="store_true", help="only the launch's own host time")
    args = parser.parse_args()
    import triton
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    launches_alone()
    if args.launch_only:
        return
    print(f"{'case':28s} | {'fast':>4} | {'host ms':>7} {'timed ms':>8} {'TFLOP/s':>7}")
    for head_dim in args.headdims:
        heads, batch = 2048 // head_dim, 16384 // args.seqlen
        for causal in (False, True):
            q, k, v = (torch.randn(batch, heads, args.seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            dout = torch.randn_like(q)

            def forward():
                with torch.no_grad():
                    return flashtile.attention(q, k, v, causal=causal, layout="bhsd")

            out = flashtile.attention(q, k, v, causal=causal, layout="bhsd")

            def backward():
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            def deterministic_backward():
                o = flashtile.attention(q, k, v, causal=causal, layout="bhsd", deterministic=True)
                return torch.autograd.grad(o, (q, k, v), dout)

            results = {}
            for enabled in (True, False):
                fast_launch.ENABLED = enabled
                results[enabled] = [forward(), *deterministic_backward()]
            same = all(torch.equal(a, b) for a, b in zip(results[True], results[False]))
            print(f"d{head_dim} {'causal' if causal else 'full'}: outputs with and without the fast path "
                  f"{'equal bit for bit' if same else 'DIFFER'}")
            for name, fn, is_backward in (("fwd", forward, False), ("bwd", backward, True)):
                for enabled in (True, False, True, False):
                    fast_launch.ENABLED = enabled
                    fn()
                    host = host_ms_per_call(fn, torch.device("cuda"))
                    timed = median_ms(fn, "cuda")
                    tflops = flops(batch, heads, args.seqlen, head_dim, causal, is_backward) / timed * 1e-9
                    label = f"d{head_dim} {'causal' if causal else 'full'} {name}"
                    print(f"{label:28s} | {'on' if enabled else 'off':>4} | {host:7.3f} {timed:8.3f} {tflops:7.0f}",
                          flush=True)
    fast_launch.ENABLED = True


if __name__ == "__main__":
    main()
