"""Where the host's time goes in a training step, without a profiler: µs per call in each layer.

    python benchmarks/probes/host_segments.py [--seqlen 16384] [--docs 16] [--steps 100]

cProfile slows Python calls several-fold and not C calls, so its shares mislead on a path that
is half torch's C++ (autograd engine, dispatcher, allocator) and half Python. Here each layer
of the call is wrapped in a timer instead (about 0.3 µs per wrap): the autograd Function, the
ops, the Triton launchers, the Gluon host code, the descriptors and each kernel launch.
A sleep kernel queued first keeps the GPU busy, so every call only enqueues (steps x launches
stay under the driver's queue depth). Prints the median over steps of each layer's time per
step, inclusive of the layers it calls, for forward (with grad) + backward, and the fastest
round's (the steadier figure for comparing two trees on a shared machine).

d128 bf16, 16 heads, batch 16384 / seqlen; causal, or with ``--docs D`` a mask_mod of causal
and D documents with a 128 x 128 block mask built once (masks.py's document rows). On a CPU
(no CUDA) the Gluon kernels are stubbed as in gluon_host_cpu.py: Triton's launcher and the
driver are then left out.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["FLASHTILE_BACKEND"] = "triton"

import flashtile  # noqa: E402
from flashtile import api, ops  # noqa: E402
from flashtile.kernels import fast_launch, hopper, launch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from masks import causal_documents  # noqa: E402

_TIMES: dict = collections.defaultdict(float)


def _timed(name, fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _TIMES[name] += time.perf_counter() - start
    return timed


def _timed_launch(fn):
    def timed(kernel, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(kernel, *args, **kwargs)
        finally:
            name = getattr(getattr(kernel, "fn", None), "__name__", None) or type(kernel).__name__
            _TIMES[f"launch {name}"] += time.perf_counter() - start
    return timed


def wrap_layers() -> None:
    """Put a timer around each layer (module attributes are looked up at call time)."""
    function = ops._AttentionFunction
    function.forward = staticmethod(_timed("Function.forward", function.forward))
    function.backward = staticmethod(_timed("Function.backward", function.backward))
    for name in ("attention_forward", "attention_backward"):
        setattr(ops, name, _timed(f"op {name}", getattr(ops, name)))
    for name in ("attention_forward_triton", "attention_backward_triton"):
        setattr(launch, name, _timed(f"launch.{name}", getattr(launch, name)))
    for name in ("forward", "backward", "eligible", "_descriptor"):
        setattr(hopper, name, _timed(f"hopper.{name}", getattr(hopper, name)))
    for name in ("check_qkv", "check_options", "check_bias", "select_backend", "check_backend_limits",
                 "_register_block_mask", "normalize_window", "last_dim_contiguous"):
        setattr(api, name, _timed(f"api.{name}", getattr(api, name)))
    ops.attention = _timed("ops.attention", ops.attention)
    torch.autograd.grad = _timed("torch.autograd.grad", torch.autograd.grad)
    fast_launch.launch = _timed_launch(fast_launch.launch)
    launch.fast_launch = hopper.fast_launch = fast_launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--docs", type=int, default=16, help="0: built-in causal instead of a document mask")
    parser.add_argument("--steps", type=int, default=100, help="steps per round (10 rounds)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gluon_host_cpu import stub_kernels
        stub_kernels()
        args.seqlen = min(args.seqlen, 1024)
    device = "cuda" if cuda else "cpu"
    batch, heads = max(1, 16384 // args.seqlen), 16
    q, k, v = (torch.randn(batch, args.seqlen, heads, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    masking = {"causal": True}
    if args.docs:
        _, mask, block_mask = causal_documents(args.seqlen, args.docs, device, block_n=128)
        masking = {"mask_mod": mask, "block_mask": block_mask}

    def step():
        out = flashtile.attention(q, k, v, **masking)
        torch.autograd.grad(out, (q, k, v), dout)

    for _ in range(5):  # compile, fill the caches
        step()
    wrap_layers()
    rounds: dict = collections.defaultdict(list)
    for _ in range(10):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(int(2e9))
        _TIMES.clear()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        _TIMES["step"] = time.perf_counter() - start
        for name, seconds in _TIMES.items():
            rounds[name].append(seconds / args.steps * 1e6)
    if cuda:
        torch.cuda.synchronize()
    label = f"{args.docs} documents" if args.docs else "causal"
    print(f"{device}, torch {torch.__version__}, {batch} x {args.seqlen} x {heads} x 128, {label}; "
          "µs per step, inclusive: median / fastest of 10 rounds")
    for name, values in sorted(rounds.items(), key=lambda item: -statistics.median(item[1])):
        print(f"  {name:40s} {statistics.median(values):8.1f} {min(values):8.1f}")


if __name__ == "__main__":
    main()
