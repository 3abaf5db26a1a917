"""Head dims between the Gluon kernels' widths (40, 96, 192) run on the next width over zero
columns: are they right, and faster than the Triton kernels? An sm_90 GPU.

    python benchmarks/probes/padded_head_dims.py [--headdims 40 96 192] [--seqlens 1024 4096 16384]

1. correctness: B = 1, 6 query heads on 2, Sq = 1000, Sk = 1100, bf16, causal and not; the
   output and dq, dk, dv with both Gluon switches on, against the float64 oracle, beside the
   Triton kernels' errors on the same inputs;
2. time through ``flashtile.attention`` (host path included, as a user calls it): forward and
   backward (``torch.autograd.grad``) TFLOP/s with the Gluon kernels forced on (=1) and off
   (=0), 16k tokens, heads = 2048 // d, bf16. TFLOP/s = 4·B·H·N²·d (×2.5 backward), halved
   when causal, with d the call's head dim (not the kernel's).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import flashtile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from launch_overhead import median_ms  # noqa: E402


def set_gluon(value: str) -> None:
    os.environ["FLASHTILE_GLUON"] = value
    os.environ["FLASHTILE_GLUON_BWD"] = value


def results(q, k, v, dout, causal):
    """out, dq, dk, dv of flashtile.attention, (B, H, S, d) layout."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashtile.attention(*leaves, causal=causal, layout="bhsd")
    return (out, *torch.autograd.grad(out, leaves, dout))


def check(head_dim: int, causal: bool) -> str:
    torch.manual_seed(0)
    q = torch.randn(1, 6, 1000, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 1100, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out = flashtile.naive_attention(*leaves, causal=causal, layout="bhsd", upcast=True)
    reference = (ref_out, *torch.autograd.grad(ref_out, leaves, dout.double()))
    cells = []
    for value in ("1", "0"):
        set_gluon(value)
        errors = [(g.double() - r).abs().max().item() for g, r in zip(results(q, k, v, dout, causal), reference)]
        cells.append(" ".join(f"{e:.4f}" for e in errors))
    return f"gluon {cells[0]} | triton {cells[1]}"


def tflops(head_dim: int, seqlen: int, causal: bool, backward: bool) -> float:
    batch, heads = 16384 // seqlen, 2048 // head_dim
    q, k, v, dout = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = flashtile.attention(*leaves, causal=causal, layout="bhsd")
    if backward:
        ms = median_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), q.device)
    else:
        ms = median_ms(lambda: flashtile.attention(*leaves, causal=causal, layout="bhsd"), q.device)
    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1) * (2.5 if backward else 1)
    return flops / ms * 1e-9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[40, 96, 192])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[1024, 4096, 16384])
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for head_dim in args.headdims:
        for causal in (False, True):
            print(f"d{head_dim} {'causal' if causal else 'full'} max errors out dq dk dv: {check(head_dim, causal)}",
                  flush=True)
    for head_dim in args.headdims:
        for backward in (False, True):
            for value in ("1", "0"):
                set_gluon(value)
                cells = [f"{tflops(head_dim, n, c, backward):5.0f}" for c in (False, True) for n in args.seqlens]
                print(f"{'bwd' if backward else 'fwd'} d{head_dim} {'gluon ' if value == '1' else 'triton'}: "
                      f"full then causal at {args.seqlens}: {' '.join(cells)}", flush=True)
    set_gluon("auto")


if __name__ == "__main__":
    main()
