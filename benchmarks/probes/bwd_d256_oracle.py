"""One small d256 Gluon backward case against the float64 oracle, Gluon beside Triton: the first
step of a GPU check of the d256 backward, before the long ones (a hung barrier shows here).

    python benchmarks/probes/bwd_d256_oracle.py      # an sm_90 GPU
"""

import os

import torch

import flashtile

os.environ["FLASHTILE_GLUON_BWD"] = "1"
torch.manual_seed(0)
for causal in (False, True):
    q = torch.randn(1, 4, 300, 256, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 333, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flashtile.attention(*leaves, causal=causal, layout="bhsd")
    got = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out = flashtile.naive_attention(*ref_leaves, causal=causal, layout="bhsd", upcast=True)
    ref = torch.autograd.grad(ref_out, ref_leaves, dout.double())
    os.environ["FLASHTILE_GLUON_BWD"] = "0"
    tri = torch.autograd.grad(flashtile.attention(*leaves, causal=causal, layout="bhsd"), leaves, dout)
    os.environ["FLASHTILE_GLUON_BWD"] = "1"
    for name, g, t, r in zip(("dq", "dk", "dv"), got, tri, ref):
        print(f"causal={causal} {name}: gluon err {(g.double() - r).abs().max().item():.4f}  "
              f"triton err {(t.double() - r).abs().max().item():.4f}  max|ref| {r.abs().max().item():.3f}", flush=True)
