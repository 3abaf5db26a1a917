"""Why the Gluon forward is slow at N = 1k causal (session 9): host time, kernel time, stages.

    FLASHTILE_GLUON=1 python benchmarks/probes/gluon_fwd_small.py    # sm_90; ~60 s

For each head dim and N (B·N = 16k tokens, H = 2048 / d), causal or not, bf16:
  api    do_bench of flashtile.attention (what speed_table.py times)
  kernel do_bench of hopper.forward alone (no argument checks, no autograd)
  graph  do_bench of a CUDA graph replaying hopper.forward (no host time at all)
  host   microseconds of Python per flashtile.attention call (perf_counter over 200 calls)
  triton do_bench of flashtile.attention with the Gluon switch off
TFLOP/s = 4·B·H·N²·d / t, halved when causal.
"""

from __future__ import annotations

import os
import time

import torch
from triton.testing import do_bench

import flashtile
from flashtile.kernels import hopper


def tflops(batch, heads, seqlen, head_dim, causal, ms):
    return 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1) / ms * 1e-9


def graph_of(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def host_us(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("   d causal     N |    api kernel  graph (TFLOP/s) | host us | triton | stages 2 / 3 (graph)")
    for head_dim in (64, 128, 256):
        for causal in (False, True):
            for seqlen in (512, 1024, 2048, 4096):
                batch, heads = 16384 // seqlen, 2048 // head_dim
                q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                out = torch.empty_like(q)
                scale = head_dim ** -0.5
                rate = lambda ms: tflops(batch, heads, seqlen, head_dim, causal, ms)  # noqa: E731
                api = lambda: flashtile.attention(q, k, v, causal=causal, layout="bhsd")  # noqa: E731
                kernel = lambda: hopper.forward(q, k, v, out, scale, causal)  # noqa: E731
                t_api = do_bench(api, warmup=25, rep=100, return_mode="median")
                t_kernel = do_bench(kernel, warmup=25, rep=100, return_mode="median")
                graph = graph_of(kernel)
                t_graph = do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
                host = host_us(api)
                os.environ["FLASHTILE_GLUON"] = "0"
                t_triton = do_bench(api, warmup=25, rep=100, return_mode="median")
                os.environ["FLASHTILE_GLUON"] = "1"
                stage_rates = []
                original = hopper._config
                for stages in (2, 3):
                    hopper._config = lambda d, n, s=stages: (original(d, n)[0], s)
                    try:
                        g = graph_of(kernel)
                        stage_rates.append(f"{rate(do_bench(g.replay, warmup=25, rep=100, return_mode='median')):4.0f}")
                    except Exception as err:  # shared memory may not hold 3 stages at d256
                        stage_rates.append(type(err).__name__[:8])
                    finally:
                        hopper._config = original
                print(f"  {head_dim:3d} {causal!s:5} {seqlen:5d} | {rate(t_api):6.0f} {rate(t_kernel):6.0f} "
                      f"{rate(t_graph):6.0f}            | {host:7.1f} | {rate(t_triton):6.0f} | "
                      f"{' / '.join(stage_rates)}", flush=True)


if __name__ == "__main__":
    main()
