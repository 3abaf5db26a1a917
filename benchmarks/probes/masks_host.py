"""Where a sparse block mask's time goes: host time per call, eager GPU time and CUDA-graph time
(kernels alone) of a forward + backward step with a document mask, under auto (the block-sparse
Gluon kernels where hopper.LISTED_UNDER_AUTO) and with every Gluon kernel off (the Triton ones).

masks.py's 16-document row (N = 16k, d128) read the backward at 1.20 ms against FlexAttention's
0.85: a step whose kernels are this short can be bound by its host path instead.

    python benchmarks/probes/masks_host.py --docs 4 16
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import flashtile
from flashtile.bench.environ import environment

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from launch_overhead import report  # noqa: E402
from masks import causal_documents  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--docs", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args()
    n, device = args.seqlen, torch.device("cuda")
    q, k, v = (torch.randn(1, n, 16, 128, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, n, 16, 128, device=device, dtype=torch.bfloat16)
    print(f"N={n}, heads 16, d128, bf16; ms: host per call, eager GPU, CUDA graph", flush=True)
    for docs in args.docs:
        _, mask, bm = causal_documents(n, docs, device, block_n=128)

        def forward():
            return flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm)

        def step():
            return torch.autograd.grad(forward(), (q, k, v), dout)

        for label, switches in (("auto", {}), ("Gluon off", {"FLASHTILE_GLUON": "0", "FLASHTILE_GLUON_BWD": "0"})):
            with environment(switches):
                report(f"{docs} docs fwd, {label}", forward, device, graphable=True)
                report(f"{docs} docs fwd+bwd, {label}", step, device, graphable=True)


if __name__ == "__main__":
    main()
