"""The d64 Gluon forward's variants by tile width, consumer count and product order, against the float64 oracle.

    python benchmarks/probes/fwd_in_turn_check.py

Session 28 (attempt 69) found four consumer warpgroups on 64-key tiles wrong from the second
K/V tile on. This probe told where: every variant with each tile's products in turn on 64-key
tiles (two, three or four consumers) was wrong, the same variants in FlashAttention-3's order or
on 128-key tiles right. The cause was ptxas giving P's wgmma operand the registers of Q's
(loaded once per Q tile) when the two have one shape; gluon_fwd._consumer now passes Q through
the S product's wait there. On an H200, a program per Q tile, bf16, (1, 2, Sq, 64) q and
(1, 2, Sk, 64) k and v: prints each case's largest error of out and of the LSE against the oracle,
and how many rows are off by more than 0.02.
"""

from __future__ import annotations

import os
import sys

import torch

from flashtile import naive_attention
from flashtile.kernels import hopper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fwd_consumers import _variant  # noqa: E402 (beside this file)

# (name, fwd_consumers.VARIANTS-style entry, the two-consumer (BLOCK_N, NUM_STAGES) or None)
VARIANTS = [("four 64 s3 turn", (4, (64, 3, 112), False), None),
            ("three 64 s2 turn", (3, (64, 2, 160), False), None),
            ("two 64 s3 turn", (2, None, False), (64, 3)),
            ("four 64 s3 overlap", (4, (64, 3, 112), True), None),
            ("three 64 s3 overlap", (3, (64, 3, 160), True), None),
            ("four 128 s2 turn", (4, (128, 2, 112), False), None),
            ("three 128 s2 turn", (3, (128, 2, 160), False), None)]
# (Sq, Sk, causal): one K/V tile was always right; these have two or more
CASES = [(1, 1023, False), (1, 128, False), (1, 65, False), (64, 192, False), (300, 300, True)]


def run(variant, two_consumer_tiles, q, k, v, causal: bool):
    """hopper.forward as ``variant`` says (two consumers on ``two_consumer_tiles`` where given)."""
    out = torch.empty_like(q)
    saved = hopper._config
    if two_consumer_tiles is not None:
        hopper._config = lambda head_dim, seqlen_k: two_consumer_tiles
    try:
        with _variant(variant):
            lse = hopper.forward(q, k, v, out, q.shape[-1] ** -0.5, causal)
    finally:
        hopper._config = saved
    return out, lse


def main() -> None:
    os.environ[hopper.FORWARD_PERSISTENT_SWITCH] = "0"
    torch.manual_seed(0)
    for sq, sk, causal in CASES:
        q = torch.randn(1, 2, sq, 64, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, 2, sk, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        oracle, oracle_lse = naive_attention(q, k, v, causal=causal, layout="bhsd", upcast=True, return_lse=True)
        for name, variant, tiles in VARIANTS:
            try:
                out, lse = run(variant, tiles, q, k, v, causal)
            except Exception as error:  # noqa: BLE001 - a variant that does not build: report, go on
                print(f"q{sq} k{sk} {name:22s} ERROR {type(error).__name__}: {str(error)[:150]}", flush=True)
                continue
            error_out = (out.double() - oracle).abs()
            bad_rows = (error_out.amax(-1) > 0.02).sum().item()
            error_lse = (lse.double() - oracle_lse).abs().max().item()
            print(f"q{sq} k{sk} {'causal' if causal else 'full'} {name:22s} out {error_out.max().item():.3e} "
                  f"lse {error_lse:.3e} bad rows {bad_rows}", flush=True)


if __name__ == "__main__":
    main()
