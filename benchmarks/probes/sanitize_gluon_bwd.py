"""compute-sanitizer runs of the Gluon backward: a few forced calls with odd lengths, q != k, GQA,
causal or not, and a check that the chosen Gluon kernels ran.

    compute-sanitizer --tool memcheck python benchmarks/probes/sanitize_gluon_bwd.py            # d256
    compute-sanitizer --tool racecheck python benchmarks/probes/sanitize_gluon_bwd.py --headdim 128 --fused

The default (head dim 256) is gluon_bwd_wide's dK/dV kernel and the dQ kernel at 32-key tiles
(session 11, as sanitize_d256.py); ``--fused`` forces gluon_bwd_fused.py's five-product kernel
(head dim 64 or 128; before Triton 3.8 its reduction is tma_reduce_ptx.py's rewrite), whose warpgroups
share K's buffer and the dS buffers.
"""

import argparse
import os

import torch

import flashtile
from flashtile.kernels import hopper

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--headdim", type=int, default=256)
parser.add_argument("--fused", action="store_true", help="the five-product backward (FLASHTILE_GLUON_BWD_FUSED=1)")
args = parser.parse_args()
os.environ.update(FLASHTILE_GLUON="1", FLASHTILE_GLUON_BWD="1", FLASHTILE_GLUON_BWD_FUSED="1" if args.fused else "0")
calls = []
name = "_fused_backward" if args.fused else "_seven_product_backward"
run = getattr(hopper, name)
setattr(hopper, name, lambda *a, **kw: calls.append(a[0].shape) or run(*a, **kw))
cases = [(1, 17, 203, 4, 2, True), (2, 203, 113, 6, 2, False), (1, 130, 130, 2, 1, True), (1, 1, 77, 2, 2, False),
         (1, 300, 1000, 3, 1, True)]
for (b, sq, sk, hq, hkv, causal) in cases:
    q = torch.randn(b, sq, hq, args.headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, args.headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    flashtile.attention(q, k, v, causal=causal).sum().backward()
torch.cuda.synchronize()
assert len(calls) == len(cases), calls
print(f"sanitize: {len(cases)} Gluon d{args.headdim} backward calls ran on {name}")
