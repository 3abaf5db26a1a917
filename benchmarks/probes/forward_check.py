"""What the forward probes check before they time anything: a forward against the float64 oracle."""

from __future__ import annotations

import torch

from flashtile import naive_attention
from flashtile.testing import assert_close_to_oracle


def forward_verdict(forward, cases, head_dim: int) -> str:
    """'ok', or the first case where ``forward(q, k, v, causal)`` -> (out, lse) breaks the tolerance
    rule (flashtile.testing) against the float64 oracle. ``cases``: (batch, seqlen_q, seqlen_k,
    heads_q, heads_kv, causal); q (B, Hq, Sq, head_dim), k and v (B, Hkv, Sk, head_dim), bf16 on
    CUDA, random from a fixed seed."""
    torch.manual_seed(0)
    for batch, sq, sk, hq, hkv, causal in cases:
        q = torch.randn(batch, hq, sq, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, hkv, sk, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out, lse = forward(q, k, v, causal)
        oracle, oracle_lse = naive_attention(q, k, v, causal=causal, layout="bhsd", upcast=True, return_lse=True)
        baseline, baseline_lse = naive_attention(q, k, v, causal=causal, layout="bhsd", upcast=False,
                                                 return_lse=True)
        try:
            assert_close_to_oracle("out", out, oracle, baseline)
            assert_close_to_oracle("lse", lse, oracle_lse, baseline_lse.float())
        except AssertionError as error:
            return f"FAILED at {(batch, sq, sk, hq, hkv, causal)}: {str(error).splitlines()[0][:120]}"
    return "ok"
