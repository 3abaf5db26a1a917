"""GPU probe of the Gluon Hopper forward prototypes: correctness against fp32, then TFLOP/s
beside flashtile's Triton forward and SDPA (cuDNN, flash) at the bench convention
(batch x seqlen = 16k tokens, 16 heads of 128), non-causal, bf16."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, "gluon_proto")
from hopper_fwd import attn_fwd, reference  # noqa: E402
import flashtile  # noqa: E402

VARIANTS = {
    "single s2": dict(BLOCK_N=128, NUM_STAGES=2),
    "single s3": dict(BLOCK_N=128, NUM_STAGES=3),
    "single n64 s3": dict(BLOCK_N=64, NUM_STAGES=3),
    "single noqk s2": dict(BLOCK_N=128, NUM_STAGES=2, PIPELINE_QK=False),
    "ws s2": dict(WS=True, BLOCK_N=128, NUM_STAGES=2),
    "ws s3": dict(WS=True, BLOCK_N=128, NUM_STAGES=3),
    "ws n64 s4": dict(WS=True, BLOCK_N=64, NUM_STAGES=4),
    "pp s2": dict(PP=True, BLOCK_N=128, NUM_STAGES=2),
    "pp s3": dict(PP=True, BLOCK_N=128, NUM_STAGES=3),
}
torch.manual_seed(0)
ok = {}
for name, cfg in VARIANTS.items():
    worst = 0.0
    try:
        for (B, H, N, D) in [(2, 4, 1024, 128), (1, 3, 1000, 128), (1, 2, 4096, 128)]:
            q, k, v = (torch.randn(B * H * N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o, lse = attn_fwd(q, k, v, D**-0.5, N, **cfg)
            ro, rlse = reference(q, k, v, D**-0.5, N)
            err = max((o.float() - ro.float()).abs().max().item(), (lse - rlse).abs().max().item())
            worst = max(worst, err)
        ok[name] = worst < 2e-2
        print(f"check {name:16s} max error {worst:.3g} {'ok' if ok[name] else 'WRONG'}", flush=True)
    except Exception as e:  # noqa: BLE001
        ok[name] = False
        print(f"check {name:16s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

print("N      | " + " | ".join(f"{n}" for n in ["flashtile", "cudnn", "fa2"] + [n for n in VARIANTS if ok[n]]))
for N in (1024, 4096, 16384):
    B, H, D = 16384 // N, 16, 128
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flop = 4 * B * H * N * N * D
    row = []
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    row.append(do_bench(lambda: flashtile.attention(q, k, v, layout="bhsd"), warmup=25, rep=100))
    for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(be):
            row.append(do_bench(lambda: F.scaled_dot_product_attention(q, k, v), warmup=25, rep=100))
    q2, k2, v2 = (t.reshape(-1, D) for t in (q, k, v))
    for name, cfg in VARIANTS.items():
        if ok[name]:
            row.append(do_bench(lambda: attn_fwd(q2, k2, v2, D**-0.5, N, **cfg), warmup=25, rep=100))
    print(f"{N:6d} | " + " | ".join(f"{flop / t * 1e-9:6.0f}" for t in row), flush=True)
