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
every 2-D TMA store of the kernel into the reduction, after Triton has made the PTX and before
ptxas assembles it. Only the kernel whose entry is named REWRITTEN is touched: the fused kernel
takes that name only where it is compiled to be rewritten (gluon_bwd_fused.py's ``repr``), so
neither its native build nor another package's kernel can be. Its other TMA stores (dK and
dV) are 4-D and stay stores.

Triton 3.6's cache key does not see the hook (3.8+ asks the hook for a part of the key, which
it gives): a binary of the same kernel built by a process without the hook would hold the
store, and dQ would be overwritten instead of summed. Every binary is therefore checked before
its first launch (``check``, handed to fast_launch.launch): at least REDUCTIONS reductions, no
2-D store left. A binary that fails is a build error: hopper.py then runs the seven-product
kernels under ``auto`` and raises under ``FLASHTILE_GLUON_BWD_FUSED=1``.
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
# The same two in the SASS, for a binary whose PTX Triton did not keep (TRITON_STORE_BINARY_ONLY).
SASS_STORE, SASS_REDUCE = "UTMASTG.2D", "UTMAREDG.2D.ADD"
# The entry name of gluon_bwd_fused._dkdv_dq_kernel built with REDUCE_BY_PTX, and its least count
# of dQ reductions: one per consumer warpgroup (each partition of the warp-specialized kernel).
# A box wider than its swizzle is copied in parts, a part a warp, so a warpgroup's reduction can
# be more than one instruction (two under the 32-byte swizzle at d128).
REWRITTEN = "_dkdv_dq_kernel_ptx_reduce"
REDUCTIONS = 2
_CACHE_KEY = "-flashtile-tma-reduce-ptx-1"  # this rewrite's part of a cache key (Triton 3.8+ asks for one)
_CACHE_HASH = hashlib.sha256(_CACHE_KEY.encode()).hexdigest()
_installed = None  # the hook this module put in place


class ReductionRewriteError(TritonError):
    """A binary of the REWRITTEN kernel that does not add dQ as it should."""


def rewrite(ptx: str) -> str:
    """``ptx`` with each 2-D TMA store made a TMA add-reduction of the same box."""
    return ptx.replace(STORE, REDUCE)


def _hook(previous):
    """A stages hook that runs ``previous`` (a hook already installed, or None), then wraps the
    PTX stage with ``rewrite`` for the REWRITTEN kernel (whose name make_ptx records in the
    metadata, from the PTX's entry). Called without arguments (Triton 3.8+ does so for the cache
    key), it returns (key, hash) of both hooks."""
    def add_rewrite(*args):
        if not args:
            if previous is None:
                return _CACHE_KEY, _CACHE_HASH
            key, digest = previous()
            return key + _CACHE_KEY, hashlib.sha256((digest + _CACHE_KEY).encode()).hexdigest()
        backend, stages, options, language, capability = args
        if previous is not None:
            previous(backend, stages, options, language, capability)
        make_ptx = stages.get("ptx")
        if make_ptx is None:  # a backend without a PTX stage: nothing to rewrite
            return

        def ptx_stage(src, metadata):
            text = make_ptx(src, metadata)
            return rewrite(text) if metadata.get("name") == REWRITTEN else text

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
    """Raise ReductionRewriteError unless the binary ``compiled`` (a CompiledKernel) adds dQ by
    REDUCTIONS TMA reductions or more and stores by none of its 2-D TMA stores: its PTX, or its SASS
    where Triton kept no PTX."""
    ptx = compiled.asm.get("ptx") or ""
    if ptx:
        text, store, reduce = ptx, STORE, REDUCE
    else:
        text, store, reduce = compiled.asm["sass"], SASS_STORE, SASS_REDUCE
    found = text.count(reduce)
    if found < REDUCTIONS or store in text:
        raise ReductionRewriteError(
            f"the five-product backward's binary (triton {triton.__version__}) holds {found} dQ reductions "
            f"(expected {REDUCTIONS} or more) and {text.count(store)} 2-D TMA stores (expected 0): a binary built "
            "without flashtile's PTX rewrite, e.g. by a process that never installed it, and found in Triton's cache. "
            "TRITON_ALWAYS_COMPILE=1 or a new TRITON_CACHE_DIR rebuilds it")
