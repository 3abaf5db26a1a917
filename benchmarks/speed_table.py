"""Forward and backward TFLOP/s of flashtile against PyTorch's fused attention, one process.

The field's convention (see PERFORMANCE.md): batch × seqlen = 16384 tokens, hidden
2048, heads = 2048 / headdim, bf16, random inputs; FLOPs forward = 4·B·H·N²·D
(halved when causal), backward = 2.5 × forward. Medians of triton.testing.do_bench.

    python benchmarks/speed_table.py --headdims 64 128 --seqlens 1024 4096 16384 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashtile

SDPA_BACKENDS = {
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def flops(batch, heads, seqlen, headdim, causal, mode):
    f = 4 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def make_fn(name, q, k, v, causal):
    """Returns a forward callable in the (B, H, S, D) layout for the named implementation."""
    if name == "flashtile":
        return lambda: flashtile.attention(q, k, v, causal=causal, layout="bhsd")

    def sdpa():
        with sdpa_kernel(SDPA_BACKENDS[name]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return sdpa


def measure(name, batch, heads, seqlen, headdim, causal, dtype):
    q, k, v = (torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=dtype).transpose(1, 2)
               .requires_grad_() for _ in range(3))
    fn = make_fn(name, q, k, v, causal)
    try:
        out = fn()
    except RuntimeError as err:  # a backend that does not take these shapes
        return None, None, str(err).splitlines()[0][:80]
    dout = torch.randn_like(out)
    t_fwd = do_bench(fn, warmup=25, rep=100, return_mode="median")
    t_bwd = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25, rep=100,
                     return_mode="median")
    return (flops(batch, heads, seqlen, headdim, causal, "fwd") / t_fwd * 1e-9,
            flops(batch, heads, seqlen, headdim, causal, "bwd") / t_bwd * 1e-9, None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--impls", nargs="+", default=["flashtile", *SDPA_BACKENDS])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    rows = []
    for headdim in args.headdims:
        for causal in (False, True):
            for seqlen in args.seqlens:
                batch, heads = 16384 // seqlen, 2048 // headdim
                row = {"headdim": headdim, "causal": causal, "seqlen": seqlen}
                for impl in args.impls:
                    fwd, bwd, err = measure(impl, batch, heads, seqlen, headdim, causal, dtype)
                    row[impl] = {"fwd": fwd, "bwd": bwd, "error": err}
                rows.append(row)
                cells = " ".join(
                    f"{impl}={row[impl]['fwd']:.0f}/{row[impl]['bwd']:.0f}" if row[impl]["fwd"] else f"{impl}=n/a"
                    for impl in args.impls)
                print(f"d={headdim} causal={causal!s:5} N={seqlen:6d}  {cells}", flush=True)
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
                "triton": __import__("triton").__version__}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    # Short ratio table last: flashtile over each baseline, forward / backward.
    print(f"\n{'d':>4} {'causal':>6} {'N':>6} | {'flashtile fwd/bwd':>17} | ratios vs " + ", ".join(args.impls[1:]))
    for row in rows:
        ft = row["flashtile"]
        ratios = []
        for impl in args.impls[1:]:
            b = row[impl]
            ratios.append(f"{ft['fwd'] / b['fwd']:.2f}/{ft['bwd'] / b['bwd']:.2f}" if b["fwd"] else "n/a")
        print(f"{row['headdim']:>4} {row['causal']!s:>6} {row['seqlen']:>6} | {ft['fwd']:7.0f} / {ft['bwd']:7.0f} | "
              + "  ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
