"""Who converts (v_who): the dQ warp writes 1000 + its program id into each Q tile's counter after
converting it; per-program counts and how often a head's next Q tile has the same converter."""
import collections
import os
import torch
import flashtile
from flashtile.kernels import hopper
os.environ["FLASHTILE_GLUON_BWD_DQ_LAST"] = "1"
for d in (128, 64):
    for causal in (False, True):
        q, k, v = (torch.randn(16, 1024, 2048 // d, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out = flashtile.attention(q, k, v, causal=causal)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        torch.cuda.synchronize()
        a = hopper._LAST_ARRIVALS.cpu().tolist()
        conv = [x - 1000 for x in a if x >= 1000]
        per = collections.Counter(conv)
        tiles_per_head = 1024 // 128
        same = sum(1 for i in range(1, len(a)) if i % tiles_per_head and a[i] >= 1000 and a[i] == a[i - 1])
        pairs = sum(1 for i in range(1, len(a)) if i % tiles_per_head and a[i] >= 1000 and a[i - 1] >= 1000)
        counts = sorted(per.values())
        print(f"d{d} causal={causal}: tiles {len(a)}, converted {len(conv)}, programs converting {len(per)}, "
              f"per program min/median/max {counts[0]}/{counts[len(counts)//2]}/{counts[-1]}, "
              f"next tile same converter {same}/{pairs}")
