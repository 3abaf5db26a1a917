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
FLASHTILE_GLUON_BWD_FUSED=0), prints:

- ``bench``: do_bench's median of torch.autograd.grad on the API's output (as flashtile bench);
- ``host``: the host's microseconds a call, 20 calls issued without a wait (the queue ahead);
- each CUDA kernel of one call under torch.profiler: its count and mean microseconds, and the sum;
- with ``--cprofile``, cProfile's top functions by own time over ``--calls`` calls (the host's share).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
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


def _profile_cell(head_dim: int, seqlen: int, calls: int, host_profile: bool, settings: list) -> None:
    heads, batch = 2048 // head_dim, max(1, 16384 // seqlen)
    q, k, v, dout = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    switches = {name for env in SETTINGS.values() for name in env}
    for name in settings:
        env = SETTINGS[name]
        for switch in switches:
            os.environ.pop(switch, None)
        os.environ.update(env)
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = flashtile.attention(*leaves, causal=True, layout="bhsd")

        def grad():
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)

        for _ in range(5):
            grad()
        bench_ms = do_bench(grad, warmup=25, rep=100, return_mode="median")
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            grad()
        host_us = (time.perf_counter() - start) / calls * 1e6
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                grad()
            torch.cuda.synchronize()
        # (each kernel: launches a call, mean microseconds a launch)
        kernels = [(event.key, event.count / calls, event.self_device_time_total / event.count)
                   for event in prof.key_averages() if event.self_device_time_total > 0]
        kernels.sort(key=lambda row: -row[1] * row[2])
        total = sum(count * mean for _, count, mean in kernels)
        flops = 2.5 * 4 * batch * heads * seqlen * seqlen * head_dim / 2
        print(f"d{head_dim} causal N={seqlen} {name:6s} bench {bench_ms:.3f} ms ({flops / bench_ms / 1e9:.0f} "
              f"TFLOP/s)  host {host_us:.0f} us a call  kernels {total:.0f} us a call", flush=True)
        for key, count, mean in kernels[:8]:
            print(f"    {count:4.1f} x {mean:8.1f} us  {key[:90]}", flush=True)
        if host_profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(calls):
                grad()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
            print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--cprofile", action="store_true", help="also cProfile the calls (host time by function)")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for head_dim in args.headdims:
        _profile_cell(head_dim, args.seqlen, args.calls, args.cprofile, args.settings)


if __name__ == "__main__":
    main()
