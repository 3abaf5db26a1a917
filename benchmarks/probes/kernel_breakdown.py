"""Each GPU kernel of one forward and one backward, flashtile beside PyTorch's cuDNN and FA2 SDPA.

    python benchmarks/probes/kernel_breakdown.py [--headdim 128] [--seqlen 16384] [--reps 10]

The bench's d128 16k backward reads 0.98-0.99x cuDNN (session 19) while the five-product
kernel alone, in a CUDA graph, is faster than cuDNN's whole backward; the rest of flashtile's
backward is bandwidth-bound passes (the float32 dQ sum zeroed, the preprocess's rowsum(dO·O),
the sum's conversion into dq). This probe says how long each kernel of each library takes, so
the gap can be put on a kernel: B·N = 16k tokens, H = 2048 / d, bf16, causal and not, each
pass run ``--reps`` times under torch.profiler (the backward through ``retain_graph``), the
mean duration of each kernel per call and the sum of the pass's kernels, in µs.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashtile

BACKENDS = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}


def attention_fn(provider: str, causal: bool):
    """(q, k, v) in (B, H, S, D) -> out, through ``provider``."""
    if provider == "flashtile":
        return lambda q, k, v: flashtile.attention(q, k, v, causal=causal, layout="bhsd")

    def sdpa(q, k, v):
        with sdpa_kernel(BACKENDS[provider]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return sdpa


def kernels_of(run, reps: int) -> dict[str, float]:
    """Mean µs per call of each GPU kernel (and memset) that ``run`` launches, over ``reps`` calls."""
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    total = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.time_range.end - event.time_range.start
    return {name: us / reps for name, us in total.items()}


def show(label: str, kernels: dict[str, float]) -> None:
    print(f"  {label}: {sum(kernels.values()):8.1f} µs in all")
    for name, us in sorted(kernels.items(), key=lambda item: -item[1]):
        print(f"    {us:8.1f}  {name[:110]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--providers", nargs="+", default=["flashtile", "sdpa-cudnn", "sdpa-flash"])
    args = parser.parse_args()
    heads, batch = 2048 // args.headdim, max(1, 16384 // args.seqlen)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    for causal in (False, True):
        q, k, v = (torch.randn(batch, heads, args.seqlen, args.headdim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        for provider in args.providers:
            fn = attention_fn(provider, causal)
            print(f"d{args.headdim} N={args.seqlen} B={batch} H={heads} {'causal' if causal else 'full'}: {provider}")
            show("forward", kernels_of(lambda: fn(q, k, v), args.reps))
            out = fn(q, k, v)
            show("backward", kernels_of(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                        args.reps))


if __name__ == "__main__":
    main()
