"""Sweep launch configs of the forward and backward kernels on the current GPU.

For each (headdim, causal) at a fixed problem (bf16, 16k tokens, hidden 2048) it
prints TFLOP/s per config, varying one kernel at a time (the backward's dK/dV and
dQ kernels are swept separately, the other held at its table config), so the table
in flashtile/kernels/configs.py is chosen from measurements.

    python benchmarks/tune_configs.py --headdims 64 128 --seqlen 4096 --which dkdv dq
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
from triton.testing import do_bench

import flashtile
from flashtile.kernels import configs
from flashtile.kernels.configs import KernelConfig

CANDIDATES = {
    "fwd": [(128, 64), (128, 128), (64, 64), (64, 128)],
    # (32, 64) and (64, 32) with 8 warps, 1 stage: the dK/dV configs that do not spill at d128;
    # (32, 32) w8 at d256, and for dQ (64, 32) w8 s2 at d256 (docs/performance.md, next steps).
    "dkdv": [(32, 128), (64, 128), (64, 64), (128, 128), (32, 64), (64, 32), (32, 32)],
    "dq": [(64, 64), (128, 64), (64, 128), (128, 128), (64, 32), (32, 64)],
}


def run(kind, cfg, batch, heads, seqlen, headdim, causal):
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    flop = 4 * batch * heads * seqlen**2 * headdim / (2 if causal else 1)
    default_bwd = configs.backward_configs(triton_pad(headdim), torch.bfloat16, causal, q.device)
    if kind == "fwd":
        ctx = configs.override(forward=cfg)
    elif kind == "dkdv":
        ctx = configs.override(backward=(cfg, default_bwd[1]))
    else:
        ctx = configs.override(backward=(default_bwd[0], cfg))
    with ctx:
        try:
            out = flashtile.attention(q, k, v, causal=causal)
            # A config is only a candidate if it computes attention: compare with PyTorch's.
            expected = torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal).transpose(1, 2)
            error = (out - expected).abs().max().item()
            if error > 0.05:
                return f"wrong (max error {error:.3g} against SDPA)"
            if kind == "fwd":
                t = do_bench(lambda: flashtile.attention(q, k, v, causal=causal), warmup=10, rep=40,
                             return_mode="median")
                return flop / t * 1e-9
            dout = torch.randn_like(out)
            t = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=10, rep=40,
                         return_mode="median")
            return 2.5 * flop / t * 1e-9
        except Exception as err:  # out of shared memory or registers: not a candidate
            return f"fail ({type(err).__name__})"


def triton_pad(headdim):
    return max(16, 1 << (headdim - 1).bit_length())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--causal", choices=["no", "yes", "both"], default="no")
    p.add_argument("--which", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    args = p.parse_args()
    # The sweep times the Triton kernels' configs: on sm_90 the Gluon kernels would take these calls.
    os.environ.update(FLASHTILE_GLUON="0", FLASHTILE_GLUON_BWD="0")
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    for headdim, causal, kind in itertools.product(args.headdims, causals, args.which):
        batch, heads = 16384 // args.seqlen, 2048 // headdim
        results = []
        for (bm, bn), w, s in itertools.product(CANDIDATES[kind], args.warps, args.stages):
            r = run(kind, KernelConfig(bm, bn, w, s), batch, heads, args.seqlen, headdim, causal)
            results.append((r if isinstance(r, float) else -1.0, f"BM={bm} BN={bn} w={w} s={s}", r))
            print(f"{kind} d={headdim} causal={causal} BM={bm} BN={bn} w={w} s={s}: {r}", flush=True)
        best = max(results)
        print(f"BEST {kind} d={headdim} causal={causal}: {best[1]} -> {best[0]:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
