"""GPU check and timing of the five-product backward (atomic_dq.py) beside the library's seven.

    python benchmarks/probes/gluon_bwd_atomic/check.py      # an H100/H200 (sm_90); ~60 s

1. Correctness: the gluon_bwd probe's oracle cases (check_bwd.check: dq, dk, dv against float32
   autograd, bound 3× SDPA's bf16 error + 1e-3·max|ref|), d128 and d64, causal or not, GQA,
   Sq != Sk both ways, partial tiles; 2 and 3 stages at d64.
2. Time (d128, H = 16, 16k tokens; d64 at H = 32 with --d64): the whole backward (zeroing the
   float32 dQ sum, preprocess, the kernel, the conversion), with dQ added by per-thread atomics
   and, under Triton 3.8+ (tools/triton_parts.sh on the GPU machine), by TMA bulk reductions
   (both checked in step 1), beside the library's two kernels
   (hopper_bwd: preprocess, dK/dV, dQ) and SDPA's cuDNN and flash backward. TFLOP/s =
   2.5·4·B·H·N²·d / t, halved when causal.
A watchdog aborts with a traceback if a step hangs for 60 s (an mbarrier deadlock).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "gluon_bwd")]
import atomic_dq  # noqa: E402
import hopper_bwd  # noqa: E402
from check_bwd import check, watchdog  # noqa: E402


class _Stages:
    """atomic_dq with a fixed pipeline depth (and way of adding dQ), shaped as check_bwd.check
    expects a module."""

    def __init__(self, stages, dq_by_tma=False):
        self.stages, self.dq_by_tma = stages, dq_by_tma

    def backward(self, *args):
        return atomic_dq.backward(*args, stages=self.stages, dq_by_tma=self.dq_by_tma)


def _has_tma_reduce() -> bool:
    """Triton 3.8 and newer: Gluon's TMA reduction, for atomic_dq's DQ_BY_TMA."""
    from triton.experimental.gluon.language.nvidia.hopper import tma

    return hasattr(tma, "async_atomic_add")


def bench(N, D, H, causal, tokens=16384, by_tma=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    watchdog()
    B = max(tokens // N, 1)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = D ** -0.5
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
    cells = []
    fns = [lambda: atomic_dq.backward(q, k, v, out, dout, lse, scale, causal),
           lambda: hopper_bwd.backward(q, k, v, out, dout, lse, scale, causal)]
    if by_tma:
        fns.insert(1, lambda: atomic_dq.backward(q, k, v, out, dout, lse, scale, causal, dq_by_tma=True))
    for fn in fns:
        ms = do_bench(fn)
        cells.append(f"{ms:7.3f} {flops / ms / 1e9:4.0f}")
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
        ms = do_bench(lambda: torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True))
        cells.append(f"{ms:7.3f} {flops / ms / 1e9:4.0f}")
    print(f"  d{D:<3d} H{H} N={N:5d} B={B:2d} {'causal' if causal else 'full  '} | " + " | ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--d64", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    import triton

    start = time.perf_counter()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    results = []
    by_tma = _has_tma_reduce()
    for dq_by_tma in (False, True) if by_tma else (False,):
        five = _Stages(2, dq_by_tma)
        for D in (128, 64):
            for N, B in ((1000, 2), (4096, 1)):
                for causal in (False, True):
                    check(B, 8, 2, N, N, D, causal, five, results)
        check(1, 8, 2, 1000, 1500, 128, True, five, results)
        check(1, 8, 2, 1500, 1000, 64, True, five, results)
        check(3, 4, 4, 77, 77, 128, False, five, results)
        check(1, 8, 2, 1050, 1050, 128, True, five, results)
        check(1, 8, 2, 1050, 1050, 64, True, _Stages(3, dq_by_tma), results)
    print(f"{sum(results)}/{len(results)} correctness cases pass ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.no_bench or not all(results):
        return 0 if all(results) else 1
    print("timing, ms and TFLOP/s: five products (atomics) | " + ("five products (TMA) | " if by_tma else "")
          + "library (seven) | sdpa cudnn | sdpa flash")
    for D, H in ((128, 16), *(((64, 32),) if args.d64 else ())):
        for causal in (False, True):
            for N in (1024, 4096, 16384):
                bench(N, D, H, causal, by_tma=by_tma)
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
