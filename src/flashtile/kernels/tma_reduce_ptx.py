"""TMA bulk reductions for Gluon before Triton 3.8: a TMA store rewritten in the PTX.

The five-product backward (gluon_bwd_fused.py) adds each tile's share of dQ into a float32 sum
with one TMA bulk reduction per warpgroup and tile,

    cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [map, {x, y}], [smem];

Gluon exposes it as ``tma.async_atomic_add`` from Triton 3.8 on. The GPU image's Triton 3.6 has
only the TMA store of the same box,

    cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [map, {x, y}], [smem];

whose operands (tensor map, coordinates, shared-memory source) and completion (a bulk group,
waited on by ``tma.store_wait``) are the reduction's: PTX's two instructions differ only in the
operation. So before 3.8 the kernel issues the store (gluon_common.tma_reduce_add) and a compile
stage, added through Triton's stages hook (``knobs.runtime.add_stages_inspection_hook``), turns
every 2-D TMA store of the kernels named in REWRITTEN into the reduction, after Triton has made
the PTX and before ptxas assembles it. Other kernels are left alone, and so are those kernels'
other TMA stores (dK and dV: 4-D boxes).

Triton 3.6's cache key does not see the hook (3.9 asks the hook for a part of the key, which it
gives): a binary of the same kernel built without it (in a process that never installed it, or
after another hook replaced this one) would hold the store, and dQ would be overwritten instead
of summed. Every binary is therefore checked before its first launch (``check``, handed to
fast_launch.launch): the reduction present, no 2-D store left. A binary that fails is a build
error: hopper.py then runs the seven-product kernels under ``auto``.
"""

from __future__ import annotations

import hashlib

import triton

try:
    from triton.errors import TritonError
except ImportError:  # (hopper.py's BUILD_ERRORS reads a missing TritonError as RuntimeError too)
    TritonError = RuntimeError

STORE = "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
REDUCE = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group"
# Kernels (Triton's metadata "name") whose 2-D TMA stores are reductions.
REWRITTEN = frozenset({"_dkdv_dq_kernel"})
_CACHE_KEY = "-flashtile-tma-reduce-ptx-1"  # this rewrite's part of a cache key (Triton 3.8+ asks for one)
_installed = None  # the hook this module put in place


class ReductionRewriteError(TritonError):
    """A binary of a REWRITTEN kernel that still stores where it should add."""


def rewrite(ptx: str) -> str:
    """``ptx`` with each 2-D TMA store made a TMA add-reduction of the same box."""
    return ptx.replace(STORE, REDUCE)


def _hook(previous):
    """A stages hook that runs ``previous`` (a hook already installed, or None), then wraps the
    PTX stage of the REWRITTEN kernels with ``rewrite``. Called without arguments (Triton 3.8+
    does so for the cache key), it returns (key, hash) of both hooks."""
    def add_rewrite(*args):
        if not args:
            key, digest = previous() if previous is not None else ("", "")
            return key + _CACHE_KEY, hashlib.sha256((digest + _CACHE_KEY).encode()).hexdigest()
        backend, stages, options, language, capability = args
        if previous is not None:
            previous(backend, stages, options, language, capability)
        make_ptx = stages.get("ptx")
        if make_ptx is None:  # a backend without a PTX stage: nothing to rewrite
            return

        def ptx_stage(src, metadata):
            text = make_ptx(src, metadata)
            return rewrite(text) if metadata.get("name") in REWRITTEN else text

        stages["ptx"] = ptx_stage

    return add_rewrite


def install() -> None:
    """Add the rewrite to Triton's compile stages, once; a hook installed before keeps running
    first. Only for a Triton whose Gluon lacks the reduction (gluon_common.HAS_TMA_REDUCE)."""
    global _installed
    runtime = triton.knobs.runtime
    if _installed is not None and runtime.add_stages_inspection_hook is _installed:
        return
    _installed = _hook(runtime.add_stages_inspection_hook)
    runtime.add_stages_inspection_hook = _installed


def check(compiled) -> None:
    """Raise ReductionRewriteError unless the binary ``compiled`` (a CompiledKernel) adds by TMA
    reductions and stores by none of its 2-D TMA stores."""
    ptx = compiled.asm.get("ptx", "")
    if REDUCE not in ptx or STORE in ptx:
        raise ReductionRewriteError(
            f"the five-product backward's binary (triton {triton.__version__}) stores dQ where it should add it: "
            "its TMA stores were not rewritten into reductions (was Triton's stages hook replaced after "
            "flashtile installed its own, or the binary built by a process without it?)")
