"""GPU self-test and timing of the Gluon Hopper backward (gluon_bwd.py via hopper_bwd.py).

    python benchmarks/probes/gluon_bwd/check_bwd.py            # needs an H100/H200 (sm_90); ~30-60 s
    python benchmarks/probes/gluon_bwd/check_bwd.py --no-bench # correctness only
    python benchmarks/probes/gluon_bwd/check_bwd.py --d64      # also time d64 (H = 32)

1. Correctness: dq, dk, dv (bf16) against torch autograd of an fp32 reference on the same
   bf16 inputs (out and LSE from the fp32 reference), non-causal and causal, N = 1000 (B = 2)
   and 4096 (B = 1), GQA 8:2, d128 and d64; plus causal Sq != Sk (bottom-right aligned).
   A gradient passes when its max error is at most 3x that of torch SDPA's bf16 backward
   (same inputs) + 1e-3·max|ref|; for Sq != Sk (SDPA is top-left there) when it is under 2%
   of max|ref|.
2. Timing (d128, H = 16, B·N = 16k tokens): the whole backward (preprocessing + dK/dV + dQ),
   each kernel alone, and torch SDPA's cuDNN and flash backward (autograd.grad on a saved
   graph). TFLOP/s = 2.5 · 4·B·H·N²·D / t, halved when causal.
A watchdog aborts with a traceback if a step hangs for 60 s (an mbarrier deadlock).
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def watchdog(seconds=60):
    faulthandler.dump_traceback_later(seconds, exit=True)


def reference(q, k, v, dout, scale, causal):
    """fp32 autograd reference; q/k/v/dout bf16 (B, H, S, D). Returns out, lse, dq, dk, dv."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.matmul(q, kk.transpose(-1, -2)) * scale
    Sq, Sk = q.shape[2], k.shape[2]
    if causal:  # bottom-right aligned
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.matmul(p, vv)
    out.backward(dout.float())
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def sdpa_grads(q, k, v, dout, scale, causal):
    """torch SDPA's bf16 backward on the same inputs (K/V expanded for GQA): the error baseline."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                         is_causal=causal, scale=scale)
    out.backward(dout)
    return q.grad, k.grad, v.grad


def check(B, Hq, Hkv, Sq, Sk, D, causal, hopper_bwd, results, dev="cuda"):
    watchdog()
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Sq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, Sk, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, Sk, D, device=dev, dtype=torch.bfloat16)
    dout = torch.randn(B, Hq, Sq, D, device=dev, dtype=torch.bfloat16)
    scale = D ** -0.5
    out, lse, *ref = reference(q, k, v, dout, scale, causal)
    base = sdpa_grads(q, k, v, dout, scale, causal) if Sq == Sk else None
    t0 = time.perf_counter()
    try:
        got = hopper_bwd.backward(q, k, v, out.to(q.dtype), dout, lse.contiguous(), scale, causal)
        if dev == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"  FAIL B={B} Hq={Hq}:{Hkv} Sq={Sq} Sk={Sk} d={D} causal={causal}: {type(e).__name__}: "
              f"{str(e).strip().splitlines()[-1][:300]}", flush=True)
        results.append(False)
        return
    first = time.perf_counter() - t0
    parts, ok = [], True
    for i, name in enumerate(("dq", "dk", "dv")):
        r = ref[i]
        err = (got[i].float() - r).abs().max().item()
        scale_ref = r.abs().max().item()
        if base is not None:
            berr = (base[i].float() - r).abs().max().item()
            good = err <= 3 * berr + 1e-3 * scale_ref
            parts.append(f"{name} {err:.2e} (sdpa {berr:.2e})")
        else:
            good = err <= 2e-2 * scale_ref
            parts.append(f"{name} {err:.2e} (max|ref| {scale_ref:.1f})")
        ok = ok and good and not math.isnan(err)
    print(f"  {'ok  ' if ok else 'FAIL'} B={B} H={Hq}:{Hkv} Sq={Sq:5d} Sk={Sk:5d} d={D:3d} "
          f"{'causal' if causal else 'full  '} | " + ", ".join(parts) + f" | first call {first:.1f}s", flush=True)
    results.append(ok)


def _lse(q, k, scale, causal):
    """LSE (B, H, N) float32 of q, k by chunks (used when the flash SDPA op is not callable)."""
    B, H, N, _ = q.shape
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    for b in range(B):
        for h in range(H):
            s = torch.matmul(q[b, h].float(), k[b, h].float().T) * scale
            if causal:
                s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
            lse[b, h] = torch.logsumexp(s, -1)
    return lse


def bench(hopper_bwd, N, D, H, causal, tokens=16384):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    watchdog()
    B = max(tokens // N, 1)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = D ** -0.5
    try:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    except Exception:  # noqa: BLE001
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        lse = _lse(q, k, scale, causal)
    flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
    row = {}
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    # the whole backward, each kernel alone (with the preprocessing), and the alternative configs
    # (hopper_bwd._config reads these variables at each call)
    for label, which, env in (("gluon", ("dkdv", "dq"), {}), ("dkdv", ("dkdv", ), {}), ("dq", ("dq", ), {}),
                              ("dkdv-s3", ("dkdv", ), {"GLUON_BWD_DKDV_STAGES": "3"}),
                              ("dq-n128", ("dq", ), {"GLUON_BWD_DQ_BLOCK_N": "128"})):
        os.environ.update(env)
        try:
            ms = do_bench(lambda: hopper_bwd.backward(q, k, v, out, dout, lse, scale, causal, dq, dk, dv, which=which))
            row[label] = (ms, flops / ms / 1e9)
        except Exception as e:  # noqa: BLE001
            row[label] = (math.nan, math.nan)
            print(f"  {label} failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}")
        for key in env:
            del os.environ[key]
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
            ms = do_bench(lambda: torch.autograd.grad(o, (qq, kk, vv), dout, retain_graph=True))
            row[label] = (ms, flops / ms / 1e9)
        except Exception as e:  # noqa: BLE001
            row[label] = (math.nan, math.nan)
            print(f"  sdpa {label} n/a: {type(e).__name__}: {str(e).strip().splitlines()[-1][:150]}")
    cells = " ".join(f"{ms:7.3f} {tf:4.0f} |" for ms, tf in row.values())
    print(f"  d{D:<3d} H{H} N={N:5d} B={B:2d} {'causal' if causal else 'full  '} | {cells}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--d64", action="store_true", help="also time d64 at H = 32")
    ap.add_argument("--emulate", action="store_true",
                    help="CPU dry run of this harness with emulate_bwd.py in place of the kernels (small cases)")
    args = ap.parse_args(argv)
    if args.emulate:
        return _emulated()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    import triton

    import hopper_bwd

    start = time.perf_counter()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"(dK/dV, dQ configs d128: {hopper_bwd._config(128)})", flush=True)
    print("correctness (max |err| against the fp32 reference):")
    results = []
    for D in (128, 64):
        for N, B in ((1000, 2), (4096, 1)):
            for causal in (False, True):
                check(B, 8, 2, N, N, D, causal, hopper_bwd, results)
    check(1, 8, 2, 1000, 1500, 128, True, hopper_bwd, results)  # bottom-right: Sk > Sq
    check(1, 8, 2, 1500, 1000, 64, True, hopper_bwd, results)   # Sq > Sk: rows that see no key
    check(3, 4, 4, 77, 77, 128, False, hopper_bwd, results)      # MHA (group 1), one partial tile
    check(1, 8, 2, 1050, 1050, 128, True, hopper_bwd, results)   # the last tiles' second halves wholly past the end
    # The alternative configs the timing tries are checked too, so a fast but wrong one shows.
    for env in ({"GLUON_BWD_DKDV_STAGES": "3"}, {"GLUON_BWD_DQ_BLOCK_N": "128"}):
        os.environ.update(env)
        print(f"  with {env}:")
        check(1, 8, 2, 1050, 1050, 128, True, hopper_bwd, results)
        for key in env:
            del os.environ[key]
    print(f"{sum(results)}/{len(results)} correctness cases pass ({time.perf_counter() - start:.0f} s)", flush=True)
    if not args.no_bench:
        print("timing: backward only, each cell 'ms TFLOP/s' (2.5*4*B*H*N^2*D/t, /2 if causal); gluon = preprocess + "
              "dkdv + dq, dkdv / dq = preprocess + that kernel")
        print(f"  {'':28s} | {'gluon':12s} | {'dkdv':12s} | {'dq':12s} | {'dkdv-s3':12s} | {'dq-n128':12s} | "
              f"{'sdpa cudnn':12s} | {'sdpa flash':12s} |")
        for causal in (False, True):
            for N in (1024, 4096, 16384):
                bench(hopper_bwd, N, 128, 16, causal)
        if args.d64:
            for causal in (False, True):
                for N in (1024, 4096, 16384):
                    bench(hopper_bwd, N, 64, 32, causal)
    faulthandler.cancel_dump_traceback_later()
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0 if all(results) else 1


class _Emulated:
    """hopper_bwd.backward's contract, computed by emulate_bwd.py's tile replay (CPU, float32)."""

    @staticmethod
    def backward(q, k, v, out, dout, lse, softmax_scale, causal):
        import emulate_bwd as em
        q, k, v, out, dout = (t.float() for t in (q, k, v, out, dout))
        lse2, delta = em.prep(out, dout, lse)
        dk, dv = em.dkdv(q, k, v, dout, lse2, delta, softmax_scale, causal)
        dq = em.dq_kernel(q, k, v, dout, lse2, delta, softmax_scale, causal)
        return dq.bfloat16(), dk.bfloat16(), dv.bfloat16()


def _emulated():
    results = []
    for causal in (False, True):
        check(2, 8, 2, 1000, 1000, 64, causal, _Emulated, results, dev="cpu")
    check(1, 8, 2, 300, 450, 64, True, _Emulated, results, dev="cpu")
    check(1, 8, 2, 450, 300, 64, True, _Emulated, results, dev="cpu")
    check(3, 4, 4, 77, 77, 128, False, _Emulated, results, dev="cpu")
    faulthandler.cancel_dump_traceback_later()
    print(f"{sum(results)}/{len(results)} emulated cases pass")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
