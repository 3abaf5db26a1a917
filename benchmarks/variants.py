"""Cost of the attention variants on the GPU: sliding window against dense causal,
dropout and bias overheads. bf16, batch 1, heads 16, headdim 128.

    python benchmarks/variants.py --seqlen 32768 --window 1024
    python benchmarks/variants.py --device cpu --seqlen 256 --window 32 --varlen 2 64   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from packed import dense_and_packed
from timing import median_ms

import flashtile


def time_fwd_bwd(**options):
    q, k, v = (torch.randn(1, ARGS.seqlen, 16, 128, device=ARGS.device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    bias = options.pop("bias", None)
    if bias == "full-row":  # a (seqlen_k,) key bias, broadcast over batch, heads and queries
        bias = torch.randn(ARGS.seqlen, device=ARGS.device, dtype=torch.bfloat16)
    out = flashtile.attention(q, k, v, bias=bias, **options)
    dout = torch.randn_like(out)
    fwd = median_ms(lambda: flashtile.attention(q, k, v, bias=bias, **options), ARGS.device)
    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), ARGS.device)
    return fwd, bwd


@contextlib.contextmanager
def band_path():
    """The window on the Triton kernels' band path, where sm_90 would run it as a block mask on
    the block-sparse Gluon kernels (hopper.BAND_AS_BLOCK_MASK): the two in one run."""
    from flashtile.kernels import hopper

    before, hopper.BAND_AS_BLOCK_MASK = hopper.BAND_AS_BLOCK_MASK, False
    try:
        yield
    finally:
        hopper.BAND_AS_BLOCK_MASK = before


def main():
    window = dict(causal=True, window_size=(ARGS.window, 0))
    rows = {
        "dense causal": (dict(causal=True), contextlib.nullcontext),
        f"sliding window {ARGS.window} (causal)": (window, contextlib.nullcontext),
        "  the same, Triton band path": (window, band_path),
        "causal + dropout 0.1": (dict(causal=True, dropout_p=0.1), contextlib.nullcontext),
        "causal + key bias": (dict(causal=True, bias="full-row"), contextlib.nullcontext),
    }
    if ARGS.window_only:
        rows = dict(list(rows.items())[:3])
    base = None
    print(f"N={ARGS.seqlen}, heads 16, headdim 128, bf16: fwd ms / bwd ms (speed-up vs dense causal)")
    for name, (options, setting) in rows.items():
        with setting():
            fwd, bwd = time_fwd_bwd(**options)
        base = base or (fwd, bwd)
        print(f"{name:32s} {fwd:8.2f} / {bwd:8.2f}   ({base[0] / fwd:5.2f}x / {base[1] / bwd:5.2f}x)", flush=True)


def varlen_vs_dense(num_seqs=8, seqlen=2048):
    """Packed sequences of equal length against the dense batch with the same tokens."""
    results = {}
    for name, (fn, leaves) in dense_and_packed(num_seqs, seqlen, 16, 128, ARGS.device, torch.bfloat16).items():
        out = fn()
        dout = torch.randn_like(out)
        results[name] = (median_ms(fn, ARGS.device),
                         median_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), ARGS.device))
    (df, db), (vf, vb) = results["dense"], results["varlen"]
    print(f"varlen vs dense ({num_seqs} x {seqlen}, causal): fwd {vf:.3f} vs {df:.3f} ms ({vf / df:.2f}x), "
          f"bwd {vb:.3f} vs {db:.3f} ms ({vb / db:.2f}x)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--varlen", type=int, nargs=2, default=[8, 2048], metavar=("SEQS", "SEQLEN"),
                        help="the varlen-vs-dense row: number of sequences and their length")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (meaningless times)")
    parser.add_argument("--window-only", action="store_true",
                        help="only dense causal and the window rows (no dropout, bias or varlen rows)")
    ARGS = parser.parse_args()
    # The varlen row first: it is short, and the dropout row may meet a caller's time limit.
    if not ARGS.window_only:
        varlen_vs_dense(*ARGS.varlen)
    main()
