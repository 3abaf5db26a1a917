"""Where a causal 1k backward through the API spends its time, by the backward's settings.

    python benchmarks/probes/api_backward_profile.py [--headdims 64 128] [--seqlen 1024] [--calls 20]

Session 32's grid read the causal 1k backward cells at 0.80 ms (d64) and 0.77-0.84 ms (d128) through
flashtile bench, on the five-product backward's persistent programs from the dynamic scheduler, where
the same kernels alone (CUDA graphs) ran 0.63 ms (d64) and 0.52 ms (d128) and the seven-product
kernels through the bench read 0.54 ms (d128). bench_vs_graph.py --backward put the loss in the API
way: hopper.backward called eagerly ran at the graph's speed, through autograd at 0.57x (d64 causal)
and 0.71x (d128 causal); non-causal at 0.99x (d64) and 0.83x (d128). This probe, one cell (B·N =
16k tokens, H = 2048 / d, bf16, (B, H, N, d), causal), per setting
("auto"; on the five-product kernel, FLASHTILE_GLUON_BWD_FUSED=1: "dynamic", persistent programs on
the counter, FLASHTILE_GLUON_BWD_PERSISTENT=1 and FLASHTILE_GLUON_BWD_DYNAMIC=1; "turns", persistent
in fixed turns; "tile", a program per key tile, FLASHTILE_GLUON_BWD_PERSISTENT=0; and "seven",
FLASHTILE_GLUON_BWD_FUSED=0), prints, in ``--rounds`` rounds with the settings' order rotated each
round (call 7 of session 32 ran them once, the counter first, on a lease whose 1k cells drifted
between calls):

- ``bench``: do_bench's median of torch.autograd.grad on the API's output (as flashtile bench);
- ``host``: the host's microseconds a call, ``--calls`` calls issued without a wait, beside the
  process's CPU microseconds a call (all threads: a host that waits shows less CPU than wall), the
  garbage collector's pauses in that window, and the caching allocator's device allocations, frees
  and synchronisations in it (any of those last three non-zero would mean the host waited on them);
- in the first round, each CUDA kernel of a call under torch.profiler: its count and mean
  microseconds, and the sum;
- with ``--cprofile``, in the last round, cProfile's top functions by own time over the calls;
- last, the medians over the rounds, and autograd's own floor on this host: a Function of the same
  inputs whose backward returns ready gradients.

For the same probe on another tree (e.g. the dynamic counter as a row of the dQ sum, before
04687b8), run it with that tree's src/ first on PYTHONPATH.
"""

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import flashtile
from flashtile.kernels import hopper

SETTINGS = {
    "auto": {},
    # (the fused kernel forced: auto runs causal d128 below 2k keys on the seven-product kernels)
    "dynamic": {hopper.FUSED_SWITCH: "1", hopper.FUSED_PERSISTENT_SWITCH: "1", hopper.FUSED_DYNAMIC_SWITCH: "1"},
    "turns": {hopper.FUSED_SWITCH: "1", hopper.FUSED_PERSISTENT_SWITCH: "1", hopper.FUSED_DYNAMIC_SWITCH: "0"},
    "tile": {hopper.FUSED_SWITCH: "1", hopper.FUSED_PERSISTENT_SWITCH: "0"},
    "seven": {hopper.FUSED_SWITCH: "0"},
}
# The caching allocator's counters (torch.cuda.memory_stats) that would mean a call waited on the device.
ALLOCATOR_EVENTS = ("num_device_alloc", "num_device_free", "num_sync_all_streams", "num_alloc_retries")


def _use_setting(name: str) -> None:
    """The environment of setting ``name``: every switch of SETTINGS unset, then its own set."""
    for switch in {switch for env in SETTINGS.values() for switch in env}:
        os.environ.pop(switch, None)
    os.environ.update(SETTINGS[name])


def _host_sample(grad, calls: int) -> dict:
    """``calls`` calls of ``grad`` issued without a wait: wall and process CPU µs a call, the garbage
    collector's pauses (ms) and the allocator's events in that window."""
    pauses = []

    def on_gc(phase, info):
        pauses.append(time.perf_counter())

    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    gc.callbacks.append(on_gc)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        grad()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gc.callbacks.remove(on_gc)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    return {"host": wall / calls * 1e6, "cpu": cpu / calls * 1e6,
            "gc_ms": sum(end - start for start, end in zip(pauses[::2], pauses[1::2])) * 1e3,
            "events": {key: after.get(key, 0) - before.get(key, 0) for key in ALLOCATOR_EVENTS}}


def _print_kernels(grad, calls: int) -> None:
    """Each CUDA kernel of a call under torch.profiler: launches a call, mean µs, and their sum."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            grad()
        torch.cuda.synchronize()
    kernels = [(event.key, event.count / calls, event.self_device_time_total / event.count)
               for event in prof.key_averages() if event.self_device_time_total > 0]
    kernels.sort(key=lambda row: -row[1] * row[2])
    print(f"    kernels {sum(count * mean for _, count, mean in kernels):.0f} us a call", flush=True)
    for key, count, mean in kernels[:8]:
        print(f"    {count:4.1f} x {mean:8.1f} us  {key[:90]}", flush=True)


def _print_cprofile(grad, calls: int) -> None:
    """cProfile's top functions by own time over ``calls`` calls of ``grad``."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        grad()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()), flush=True)


def _profile_cell(head_dim: int, seqlen: int, args) -> None:
    heads, batch = 2048 // head_dim, max(1, 16384 // seqlen)
    q, k, v, dout = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * head_dim / 2
    results = {name: [] for name in args.settings}
    for round_ in range(args.rounds):
        turn = round_ % len(args.settings)
        for name in args.settings[turn:] + args.settings[:turn]:
            _use_setting(name)
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            out = flashtile.attention(*leaves, causal=True, layout="bhsd")

            def grad():
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)

            for _ in range(5):
                grad()
            bench_ms = do_bench(grad, warmup=25, rep=100, return_mode="median")
            sample = _host_sample(grad, args.calls)
            results[name].append((bench_ms, sample["host"]))
            print(f"d{head_dim} causal N={seqlen} round {round_} {name:7s} bench {bench_ms:.3f} ms "
                  f"({flops / bench_ms / 1e9:.0f} TFLOP/s)  host {sample['host']:.0f} us a call, CPU "
                  f"{sample['cpu']:.0f}, gc {sample['gc_ms']:.1f} ms, allocator {sample['events']}", flush=True)
            if round_ == 0:
                _print_kernels(grad, args.calls)
            if args.cprofile and round_ == args.rounds - 1:
                _print_cprofile(grad, args.calls)
    for name, rows in results.items():
        print(f"d{head_dim} causal N={seqlen} {name:7s} medians of {args.rounds} rounds: bench "
              f"{statistics.median(r[0] for r in rows):.3f} ms, host {statistics.median(r[1] for r in rows):.0f} us "
              "a call", flush=True)


class _ReadyGradients(torch.autograd.Function):
    """Autograd's floor: a Function whose backward returns gradients made beforehand."""

    @staticmethod
    def forward(ctx, q, k, v, ready):
        ctx.ready = ready
        return q.detach().clone()

    @staticmethod
    def backward(ctx, grad_out):
        return (*ctx.ready, None)


def _autograd_floor(calls: int) -> None:
    q, k, v, dout = (torch.randn(16, 16, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    out = _ReadyGradients.apply(*leaves, tuple(torch.empty_like(t) for t in leaves))
    sample = _host_sample(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), calls)
    print(f"autograd floor (a Function returning ready gradients): host {sample['host']:.0f} us a call, "
          f"CPU {sample['cpu']:.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the settings' order rotated each round")
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--cprofile", action="store_true", help="also cProfile the calls (host time by function)")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for head_dim in args.headdims:
        _profile_cell(head_dim, args.seqlen, args)
    _autograd_floor(args.calls)


if __name__ == "__main__":
    main()
