"""compute-sanitizer memcheck of the d256 Gluon backward (gluon_bwd_wide's dK/dV kernel and the dQ
kernel at 32-key tiles): odd lengths, q != k, GQA, causal or not; checks the Gluon path ran.

    compute-sanitizer --tool memcheck python benchmarks/probes/sanitize_d256.py   # an sm_90 GPU
"""

import os

import torch

import flashtile
from flashtile.kernels import hopper


os.environ.update(FLASHTILE_GLUON="1", FLASHTILE_GLUON_BWD="1")
calls = []
run = hopper.backward
hopper.backward = lambda *a, **kw: calls.append(a[0].shape) or run(*a, **kw)
for (b, sq, sk, hq, hkv, causal) in [(1, 17, 203, 4, 2, True), (2, 203, 113, 6, 2, False), (1, 130, 130, 2, 1, True),
                                     (1, 1, 77, 2, 2, False), (1, 300, 1000, 3, 1, True)]:
    q = torch.randn(b, sq, hq, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    flashtile.attention(q, k, v, causal=causal).sum().backward()
torch.cuda.synchronize()
assert len(calls) == 5, calls
print("sanitize256: 5 Gluon d256 backward calls ran")
