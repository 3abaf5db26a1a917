"""Build one variant's kernels at the bench's 1k shapes (16k tokens, hidden 2048): one forward and backward."""
import sys
import torch
import flashtile
for d in (64, 128):
    for causal in sys.argv[1:]:
        q, k, v = (torch.randn(16, 1024, 2048 // d, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out = flashtile.attention(q, k, v, causal=causal == "yes")
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
torch.cuda.synchronize()
