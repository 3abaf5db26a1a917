"""The five-product backward's preprocess (bwd._bwd_preprocess with PADDED and the dQ sum zeroed,
as hopper's _BackwardStats.preprocess launches it) timed alone at other tile rows and warps.

At the bench's 1k shapes it moves ~270 MB (O and dO read, 134 MB; the float32 dQ sum zeroed,
134 MB; lse2 and Delta written). Each configuration's Delta, lse2 and zeroed sum are checked
against torch before it is timed. Session 36 (H200): 3.4-3.9 TB/s in every configuration.

    python benchmarks/probes/preprocess_config.py [--headdims 64 128] [--seqlen 1024]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from timing import graph_ms  # noqa: E402

from flashtile.kernels import bwd, hopper  # noqa: E402
from flashtile.kernels.common import cdiv, padded_head_dim  # noqa: E402


def launch(out, dout, lse, lse2, delta, dq_sum, counter, rows: int, warps: int) -> None:
    """hopper's preprocess launch, with BLOCK_M = rows and num_warps = warps."""
    batch, heads, seqlen, head_dim = out.shape
    s_pad = lse2.shape[1]
    blocks = s_pad // rows
    bwd._bwd_preprocess[(blocks * batch * heads,)](
        out, dout, lse, delta, lse, lse, lse2, dq_sum, counter,
        *out.stride(), *dout.stride(), lse.stride(0), lse.stride(1), s_pad, heads, seqlen, blocks,
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=padded_head_dim(head_dim), BLOCK_M=rows, HAS_DLSE=False, IS_VARLEN=False,
        PADDED=True, DQ_SUM_WIDTH=dq_sum.shape[1], num_warps=warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    if not set(args.headdims) <= set(hopper.BWD_FUSED):  # (the dQ sum exists only for the five-product kernel)
        parser.error(f"--headdims: the five-product backward runs at {sorted(hopper.BWD_FUSED)}, got {args.headdims}")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · preprocess alone, CUDA graphs, µs")
    print(f"{'d':>4} {'rows':>5} {'warps':>5} {'µs':>8} {'TB/s':>6}")
    for head_dim in args.headdims:
        batch, heads, seqlen = 16384 // args.seqlen, 2048 // head_dim, args.seqlen
        s_pad = cdiv(seqlen, hopper.STATS_ROWS) * hopper.STATS_ROWS  # (as hopper pads the stats rows)
        out, dout = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lse = torch.randn(batch, heads, seqlen, device="cuda", dtype=torch.float32)
        lse2 = torch.empty(batch * heads, s_pad, device="cuda", dtype=torch.float32)
        delta = torch.empty_like(lse2)
        dq_sum = torch.empty(batch * heads * s_pad, head_dim, device="cuda", dtype=torch.float32)
        counter = torch.empty(1, device="cuda", dtype=torch.int32)
        want_delta = (out.float() * dout.float()).sum(-1).reshape(batch * heads, seqlen)
        moved = 2 * out.numel() * 2 + dq_sum.numel() * 4 + 2 * lse2.numel() * 4 + lse.numel() * 4
        for rows, warps in itertools.product(args.rows, args.warps):
            if hopper.STATS_ROWS % rows:
                continue
            dq_sum.fill_(1.0)
            launch(out, dout, lse, lse2, delta, dq_sum, counter, rows, warps)
            torch.cuda.synchronize()
            assert torch.allclose(delta[:, :seqlen], want_delta, rtol=1e-4, atol=1e-3), (head_dim, rows, warps)
            assert torch.allclose(lse2[:, :seqlen], lse.reshape(batch * heads, seqlen) * hopper.LOG2E)
            assert not dq_sum.any().item()
            ms = graph_ms(lambda: launch(out, dout, lse, lse2, delta, dq_sum, counter, rows, warps))
            print(f"{head_dim:>4} {rows:>5} {warps:>5} {ms * 1e3:>8.1f} {moved / ms / 1e9:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
