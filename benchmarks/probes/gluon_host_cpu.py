"""Host time of the Gluon path on a machine without a GPU: the Python up to the launches.

    TRITON_INTERPRET=1 python benchmarks/probes/gluon_host_cpu.py [--calls 50] [--profile] [--layers]

The Gluon kernels and the backward's preprocess are replaced by launches that do nothing,
and ``hopper.eligible`` answers yes, so tiny CPU tensors (1 × 128 × 2 × 128, bf16) walk the
path a d128 call takes on an H200: argument checks, the autograd Function, the op
dispatch, the buffers, the descriptors. Left out: the eligibility check itself, Triton's
launcher and the driver. Prints µs per call for a forward without grad and for forward +
backward (``torch.autograd.grad``), the median and the fastest of 60 rounds; ``--profile`` adds
cProfile's top functions of forward + backward, ``--layers`` the time of each layer of a forward with
grad (and of the eligibility check). For comparing two trees (PYTHONPATH=.old/src), not for
absolute figures: the H200 machine's CPU ran the same path ~2-3× slower than this one.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["FLASHTILE_BACKEND"] = "triton"

import torch  # noqa: E402

import flashtile  # noqa: E402
from flashtile.kernels import bwd, gluon_bwd, gluon_bwd_wide, gluon_fwd, hopper  # noqa: E402


class _NoLaunch:
    """kernel[grid](...) that launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


_REAL_ELIGIBLE = hopper.eligible  # (timed by --layers with its device check passed)


def stub_kernels() -> None:
    hopper.eligible = lambda *args, **kwargs: True
    gluon_fwd._fwd_pingpong_kernel = _NoLaunch()
    gluon_bwd._dkdv_kernel = _NoLaunch()
    gluon_bwd._dq_kernel = _NoLaunch()
    gluon_fwd._fwd_listed_kernel = _NoLaunch()  # the block-sparse ones (host_segments.py --docs)
    gluon_bwd._dkdv_listed_kernel = _NoLaunch()
    gluon_bwd._dq_listed_kernel = _NoLaunch()
    gluon_bwd_wide._dkdv_wide_kernel = _NoLaunch()
    bwd._bwd_preprocess = _NoLaunch()  # the five-product backward's (hopper._RowStats.preprocess)
    fused = hopper._fused_module()  # (d64, and causal d128 since session 33)
    fused._dkdv_dq_kernel = _NoLaunch()
    fused._dq_convert = _NoLaunch()
    fused._dkdv_parts_convert = _NoLaunch()
    hopper.sm_count = lambda device: 132  # an H200's, for the persistent forward's grid


def layers(q, k, v) -> list:
    """(name, call) of each layer a d128 causal forward with grad passes through, outermost first,
    each called as the one above calls it (q, k, v: (B, S, H, D) leaves), and hopper.eligible (stubbed
    for the other figures) with its device check passed, as on an H200."""
    from flashtile import ops
    from flashtile.kernels import launch
    from flashtile.masks import Band

    detached = [t.detach() for t in (q, k, v)]
    views = [t.transpose(1, 2) for t in detached]
    out = torch.empty_like(views[0])
    band, scale = Band(None, 0), q.shape[-1] ** -0.5
    options = ("bshd", scale, None, 0, 0.0, None, "triton", False, None, 0.0, None, None, None, 0, 0, None, None)

    def eligible():
        real = hopper._device_runs_them
        hopper._device_runs_them = lambda t: True
        try:
            return _REAL_ELIGIBLE(*views, out, band, softcap=0.0, alibi_slopes=None, bias=None, dropout_p=0.0,
                                  varlen=None, block_mask=None, score_mod=None)
        finally:
            hopper._device_runs_them = real

    return [
        ("flashtile.attention (with grad)", lambda: flashtile.attention(q, k, v, causal=True)),
        ("ops.attention (the autograd Function around the op)", lambda: ops.attention(q, k, v, *options)),
        ("ops._attention_forward (the op's body)", lambda: ops._attention_forward(*detached, *options)),
        ("launch.attention_forward_triton", lambda: launch.attention_forward_triton(*views, out, scale, band, 0.0,
                                                                                    None, False)),
        ("hopper.forward", lambda: hopper.forward(*views, out, scale, True)),
        ("hopper.eligible, its device check passed (not in the above)", eligible),
    ]


def per_call_us(fn, calls: int, rounds: int = 60) -> tuple[float, float]:
    """(median, fastest) µs per call over ``rounds`` rounds of ``calls`` calls. On a shared
    virtual machine the median of one run can move by half between runs; the fastest round
    is the steadier figure for comparing two trees."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times), min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per round")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--layers", action="store_true",
                        help="also µs per call of each layer of the forward with grad, outermost first")
    args = parser.parse_args()
    stub_kernels()
    q, k, v = (torch.randn(1, 128, 2, 128, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 128, 2, 128, dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            flashtile.attention(q, k, v, causal=True)

    def forward_backward():
        out = flashtile.attention(q, k, v, causal=True)
        torch.autograd.grad(out, (q, k, v), dout)

    for fn in (forward, forward_backward):
        fn()  # first call: imports, caches
    (fwd_median, fwd_min), (both_median, both_min) = (per_call_us(fn, args.calls) for fn in (forward, forward_backward))
    print(f"torch {torch.__version__}, µs per call (kernels stubbed), median / fastest of "
          f"{per_call_us.__defaults__[0]} rounds: "
          f"forward {fwd_median:.1f} / {fwd_min:.1f}, forward + backward {both_median:.1f} / {both_min:.1f}")
    if args.layers:
        for name, fn in layers(q, k, v):
            fn()
            print(f"  {name:58s} {per_call_us(fn, args.calls)[1]:6.1f} µs (fastest round)")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            forward_backward()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue())


if __name__ == "__main__":
    main()
