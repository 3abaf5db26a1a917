"""The five-product Gluon backward (gluon_bwd_fused.py) against the seven-product one, on an H100/H200,
to place kernels/hopper.py's fused_measured_faster rule (before Triton 3.8 its dQ reduction is
tma_reduce_ptx.py's rewrite of a TMA store).

    python benchmarks/probes/fused_bwd.py [--headdims 128 64] [--seqlens 1024 2048 4096 8192 16384]
    python benchmarks/probes/fused_bwd.py --headdims 64 --tiles 64,128,2 64,128,3 128,128,2   # a tile sweep

Each cell (bf16, 16k tokens, H = 2048 / d) is timed three ways, TFLOP/s = 4·B·H·N²·d·2.5 (halved
when causal): the kernels alone as a CUDA graph (preprocess + the backward's kernels) with
FLASHTILE_GLUON_BWD_FUSED=0 and =1, then, where asked (--api), torch.autograd.grad through
flashtile.attention with each (host path included). Before timing, one causal and one
non-causal case of each head dim is checked against the float64 oracle with the fused kernel.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import flashtile
from flashtile.kernels import hopper
from flashtile.testing import assert_close_to_oracle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_sweep import time_config  # noqa: E402


def check(head_dim: int, causal: bool, seqlen_q: int = 1000, seqlen_k: int = 1100, batch: int = 1,
          heads: int = 6) -> None:
    """The fused backward's gradients against the float64 oracle (GQA 3:1, ``heads`` query heads)."""
    q = torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(batch, heads // 3, seqlen_k, head_dim, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    dout = torch.randn_like(q)
    grads = torch.autograd.grad(flashtile.attention(q, k, v, causal=causal, layout="bhsd"), (q, k, v), dout)
    expected, plain = ([*torch.autograd.grad(flashtile.naive_attention(q, k, v, causal=causal, layout="bhsd",
                                                                       upcast=upcast), (q, k, v), dout)]
                       for upcast in (True, False))
    for name, g, e, p in zip(("dq", "dk", "dv"), grads, expected, plain):
        assert_close_to_oracle(name, g, e, p, grad=True)


def tiles(text: str) -> tuple[int, int, int]:
    """"64,128,3" -> (BLOCK_M, BLOCK_N, stages) of the fused kernel."""
    m, n, stages = (int(x) for x in text.split(","))
    return m, n, stages


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--api", action="store_true", help="also time flashtile.attention's backward")
    parser.add_argument("--tiles", nargs="+", type=tiles, default=[None], metavar="M,N,STAGES",
                        help="fused kernel tiles to try at every head dim (default: hopper.BWD_FUSED's), "
                             "e.g. 64,128,3 128,128,2")
    args = parser.parse_args()
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    if not hopper._gluon_common().HAS_TMA_REDUCE:  # the reduction a TMA store rewritten in the PTX
        print("this Triton's Gluon has no TMA reductions (3.8+): the fused kernel's is tma_reduce_ptx.py's rewrite")
    calls = []
    fused = hopper._fused_backward
    hopper._fused_backward = lambda *a, **kw: (calls.append(1), fused(*a, **kw))[1]
    ways = [("graph", False)] + ([("api", True)] if args.api else [])
    for head_dim in args.headdims:
        table = hopper.BWD_FUSED[head_dim]
        seven = {}  # (causal, way): the seven-product kernels' row, timed once per head dim
        for config in args.tiles:
            hopper.BWD_FUSED[head_dim] = config or table
            os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
            calls.clear()
            for causal in (False, True):
                check(head_dim, causal)
            assert calls, "the check did not take the fused backward"
            print(f"d{head_dim} tiles {hopper.BWD_FUSED[head_dim]}: fused gradients within the oracle's tolerance "
                  "(causal and not)", flush=True)
            for causal in (False, True):
                for way, api in ways:
                    if (causal, way) not in seven:
                        os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "0"
                        seven[causal, way] = [time_config("bwd", head_dim, n, causal, api=api) for n in args.seqlens]
                    os.environ["FLASHTILE_GLUON_BWD_FUSED"] = "1"
                    five = [time_config("bwd", head_dim, n, causal, api=api) for n in args.seqlens]
                    ratio = " ".join(f"{b / a:5.2f}" for a, b in zip(seven[causal, way], five))
                    print(f"d{head_dim} {'causal' if causal else 'full  '} {way:5s} N={args.seqlens}\n"
                          f"    seven {' '.join(f'{t:5.0f}' for t in seven[causal, way])}\n"
                          f"    five  {' '.join(f'{t:5.0f}' for t in five)}\n"
                          f"    ratio {ratio}", flush=True)
        hopper.BWD_FUSED[head_dim] = table


if __name__ == "__main__":
    main()
