"""Compile every Triton kernel for Hopper (sm_90) on any machine, no GPU needed.

The interpreter runs the kernels' Python, not Triton's compiler: errors that only the
compiler sees (a non-constexpr global, a type clash between static branches, an
unsupported op) pass the CPU suite. This compiles each kernel down to a cubin with
Triton's bundled ptxas, for a set of constexpr variants, and reports wgmma use and
shared memory. Run it before handing kernel changes to a GPU:

    python tools/compile_check.py            # all variants (~10 s each on 2 cores)
    python tools/compile_check.py --quick    # one variant per kernel
    python tools/compile_check.py --smem     # the config fit's shared-memory estimate vs Triton's

The dense Gluon forward's SASS is also checked for wgmma register operands one product leaves for
another (tools/sass_operands.py).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import sass_operands  # (beside this file)
from flashtile.kernels.append import _append_kv_kernel
from flashtile.kernels.bwd import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess
from flashtile.kernels.decode import _combine_splits_kernel, _decode_kernel
from flashtile.kernels.fwd import _fwd_kernel
from flashtile.kernels.padding import _fill_rows_outside_kernel

FLOAT_ARGS = {"qk_scale", "softcap", "dropout_p", "softmax_scale", "value"}
POINTER_TYPES = {  # pointer arguments by name; the rest of the tensors are bf16
    "LSE": "*fp32", "Delta": "*fp32", "DLSE": "*fp32", "Alibi": "*fp32", "DBias": "*fp32", "OutPartial": "*fp32",
    "LsePartial": "*fp32", "Lse": "*fp32", "Cu_seqlens_q": "*i32", "Cu_seqlens_k": "*i32", "Seed": "*i64",
    "CacheSeqlens": "*i32", "CacheBatchIdx": "*i32", "LeftPad": "*i32", "BlockTable": "*i32", "KvIdx": "*i32",
    "KvPartial": "*i32", "KvCount": "*i32", "KvOrder": "*i32", "KvRuns": "*i32", "QIdx": "*i32", "QPartial": "*i32",
    "QCount": "*i32", "QOrder": "*i32", "QRuns": "*i32", "MaskBuf": "*i32", "ScoreBuf": "*fp32",
    "Cu": "*i32", "LSE2": "*fp32", "DqSum": "*fp32", "Counter": "*i32",
}
TENSORS = {"Q", "K", "V", "Out", "DO", "DK", "DV", "DQ", "Bias", "X", "DescK", "DescV", "DescQ", "DescDO", "KCache",
           "VCache"}
# Tensor descriptors with USE_TMA (plain pointers without), by the tile side their rows follow.
DESCRIPTORS = {"DescK": "BLOCK_N", "DescV": "BLOCK_N", "DescQ": "BLOCK_M", "DescDO": "BLOCK_M"}


# The strides of Q, K, V, O and their gradients (b, h, m/n): a launch on contiguous tensors
# with a head dim that is a multiple of 16 sees them all divisible by 16, and the last-dim
# strides (…d) equal to 1, and Triton specialises on both. Without that, loads cannot be
# vectorised or made asynchronous: no pipelining, and register and spill counts that a real
# launch never has.
ROW_STRIDES = re.compile(r"^stride_(q|k|v|o|do|dk|dv|dq)[bhmn]$")
LAST_DIM_STRIDES = re.compile(r"^stride_(q|k|v|o|do|dk|dv|dq)d$")


def compile_variant(kernel, constexprs: dict, num_warps: int, num_stages: int):
    """A cubin for sm_90, specialised as a launch on contiguous tensors would be (see ROW_STRIDES)."""
    signature_params = inspect.signature(kernel.fn).parameters
    params = list(signature_params)
    constexprs = {k: v for k, v in constexprs.items() if k in params}  # SCORE_GRAD: backward kernels only
    for name, param in signature_params.items():  # constexprs left out take their defaults, as at a launch
        has_default = param.default is not inspect.Parameter.empty
        if name not in constexprs and has_default and "constexpr" in str(param.annotation):
            constexprs[name] = param.default
    constexprs.update({p: 1 for p in params if LAST_DIM_STRIDES.match(p)})
    aligned_rows = constexprs.get("HEAD_DIM", 16) % 16 == 0
    divisible = [p for p in params if p in POINTER_TYPES or p in TENSORS or (aligned_rows and ROW_STRIDES.match(p))]
    if constexprs.get("USE_TMA"):
        divisible = [p for p in divisible if p not in DESCRIPTORS]
    signature = {}
    for p in params:
        if p in constexprs:
            signature[p] = "constexpr"
        elif p in DESCRIPTORS and constexprs.get("USE_TMA"):  # one (1, 1, rows, D) tile per copy
            rows = constexprs[DESCRIPTORS[p]]
            signature[p] = f"tensordesc<bf16[1, 1, {rows}, {constexprs['HEAD_DIM_PADDED']}]>"
        elif p in POINTER_TYPES:
            signature[p] = POINTER_TYPES[p]
        elif p in TENSORS:
            signature[p] = "*bf16"
        elif p in FLOAT_ARGS:
            signature[p] = "fp32"
        else:
            signature[p] = "i32"
    src = ASTSource(fn=kernel, signature=signature, constexprs={(params.index(k),): v for k, v in constexprs.items()},
                    attrs={(params.index(p),): [["tt.divisibility", 16]] for p in divisible})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps,
                                                                               num_stages=num_stages))


# The keys of a Gluon variant's constexprs that describe its descriptors, not kernel parameters.
DESCRIPTOR_KEYS = ("DTYPE", "Q_ROWS", "KV_ROWS")

# The block-sparse Gluon kernels' int32 pointers: a block mask's lists and the mask's tensor.
LIST_POINTERS = ("KvIdx", "KvPartial", "KvCount", "KvOrder", "QIdx", "QPartial", "QCount", "QOrder", "MaskBuf")


def compile_gluon_variant(kernel, constexprs: dict, num_warps: int):
    """A cubin for sm_90 of a Gluon kernel taking tensor descriptors (kernels/gluon_fwd.py,
    gluon_bwd.py). Three keys of ``constexprs`` are not kernel parameters: DTYPE ("bf16" or
    "fp16"), and Q_ROWS and KV_ROWS, the rows of the (1, 1, rows, D) blocks that the
    descriptors of q-shaped and k-shaped tensors carry."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    constexprs = dict(constexprs, num_warps=num_warps)
    dtype, q_rows, kv_rows = (constexprs.pop(key) for key in DESCRIPTOR_KEYS)
    # A constexpr parameter with a default (e.g. the forward's CONSUMERS) takes it, as a launch
    # binds it; without it here it would be typed as a runtime argument.
    for name, parameter in inspect.signature(kernel.fn).parameters.items():
        if (name not in constexprs and parameter.default is not inspect.Parameter.empty
                and "constexpr" in str(parameter.annotation)):
            constexprs[name] = parameter.default
    # The fused backward's float32 partials are pointers under TAIL_SPLIT; otherwise a launch
    # passes None for them and 1 parts (constants to Triton).
    if "TAIL_SPLIT" in inspect.signature(kernel.fn).parameters and not constexprs.get("TAIL_SPLIT", False):
        constexprs.update(DkPart=None, DvPart=None, splits=1)
    # The persistent forward's dynamic scheduler (DYNAMIC, not a parameter): its counter is an
    # int32 pointer; otherwise a launch passes None for it (a constant to Triton).
    if "TileCounter" in inspect.signature(kernel.fn).parameters and not constexprs.pop("DYNAMIC", False):
        constexprs.update(TileCounter=None)
    # The forward's timeline buffer (TRACE, not a parameter: probes/fwd_timeline.py's): an int64
    # pointer; otherwise None, as at a launch.
    if "Trace" in inspect.signature(kernel.fn).parameters and not constexprs.pop("TRACE", False):
        constexprs.update(Trace=None)
    if constexprs.get("ROW_STATS") is False:  # a dQ kernel reading the preprocess's rows: Nones, as at a launch
        from flashtile.kernels import hopper

        constexprs.update(dict.fromkeys(hopper.ROW_STATS_PARAMS))
    by_ptx = constexprs.get("REDUCE_BY_PTX", False)
    if by_ptx:  # its TMA store becomes the reduction as the PTX is made, as at a launch
        from flashtile.kernels import tma_reduce_ptx

        tma_reduce_ptx.install()
    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def descriptor(rows):
        box = [1, 1, rows, constexprs["HEAD_DIM"]]
        return f"tensordesc<{dtype}{box},{gl.NVMMASharedLayout.get_default_for(box, element)!r}>".replace(" ", "")

    # The backward's LSE and D rows: (B·Hq, S_pad) float32, copied BLOCK_M at a time, unswizzled.
    stats_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    stats = f"tensordesc<fp32[1,{constexprs['BLOCK_M']}],{stats_layout!r}>".replace(" ", "")
    params = list(inspect.signature(kernel.fn).parameters)
    # The fused backward's float32 dQ sum: (BLOCK_M, D / 2) boxes.
    sum_box = [constexprs["BLOCK_M"], constexprs["HEAD_DIM"] // 2]
    from flashtile.kernels import hopper

    dq_sum = f"tensordesc<fp32{sum_box},{hopper._sum_layout(tuple(sum_box), hopper.dq_sum_swizzle())!r}>"
    typed = {**{name: descriptor(q_rows) for name in ("q_desc", "o_desc", "do_desc", "dq_desc")},
             **{name: descriptor(kv_rows) for name in ("k_desc", "v_desc", "dk_desc", "dv_desc")},
             "dq_acc_desc": dq_sum.replace(" ", ""), "lse_desc": stats, "delta_desc": stats,
             "LSE": "*fp32", "LSE2": "*fp32", "Delta": "*fp32", "DLSE": "*fp32", "Out": f"*{dtype}", "DO": f"*{dtype}",
             **{name: "*i32" for name in LIST_POINTERS},
             "DkPart": "*fp32", "DvPart": "*fp32", "qk_scale": "fp32", "softmax_scale": "fp32",
             "TileCounter": "*i32", "Trace": "*i64"}
    signature = {p: "constexpr" if p in constexprs else typed.get(p, "i32") for p in params}
    # Pointers and the padded row stride (a multiple of 128) are 16-aligned at a launch.
    divisible = [p for p in ("LSE", "LSE2", "Delta", "DLSE", "Out", "DO", "stride_lrow", "DkPart", "DvPart",
                             "TileCounter", *LIST_POINTERS) if p in params and p not in constexprs]
    src = GluonASTSource(fn=kernel, signature=signature,
                         constexprs={(params.index(k),): v for k, v in constexprs.items()},
                         attrs={(params.index(p),): [["tt.divisibility", 16]] for p in divisible})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    if by_ptx:
        tma_reduce_ptx.check(compiled)  # the rewrite took: the reduction there, no 2-D store left
    return compiled


def gluon_variants(quick: bool):
    """The Gluon kernels' variants: (name, kernel, constexprs, warps); none where this Triton
    has no Gluon Hopper support (attention then always runs the Triton kernels)."""
    from flashtile.kernels import hopper

    if hopper._gluon() is None:
        print("skip gluon kernels: this Triton has no Gluon Hopper support")
        return
    gluon_fwd, _, _, gluon_bwd, gluon_bwd_wide = hopper._gluon()
    regs = dict(LOADER_REGS=24, CONSUMER_REGS=240)
    cases = [(128, True, "bf16", 2)] if quick else [
        (128, False, "bf16", 2), (128, True, "bf16", 3), (128, True, "fp16", 2), (64, False, "fp16", 2),
        (64, True, "bf16", 2), (256, True, "bf16", 2), (256, False, "fp16", 2)]
    for d, causal, dtype, stages in cases:
        block_n = 64 if d > 128 else 128
        yield (f"gluon fwd d={d} {'causal' if causal else 'full'} {dtype} s{stages}", gluon_fwd._fwd_pingpong_kernel,
               dict(HEAD_DIM=d, BLOCK_M=128, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal, DTYPE=dtype,
                    Q_ROWS=64, KV_ROWS=block_n, **regs), 4)
    # Three consumer warpgroups of 64 rows at d64 (FLASHTILE_GLUON_FWD_CONSUMERS=3): 192-row tiles,
    # each tile's products in the order FORWARD_OVERLAP says (none in a tree from before them, which
    # sass_compare.py may be dumping).
    block_n, stages = getattr(hopper, "FORWARD_THREE_CONSUMER_TILES", (None, None))
    overlap = getattr(hopper, "FORWARD_OVERLAP", {}).get(3, True)
    for causal, dtype in [] if block_n is None else [(True, "bf16")] if quick else [
            (False, "bf16"), (True, "bf16"), (True, "fp16")]:
        order = "" if overlap else " in turn"
        yield (f"gluon fwd3 d=64 {'causal' if causal else 'full'} {dtype} s{stages}{order}",
               gluon_fwd._fwd_pingpong_kernel,
               dict(HEAD_DIM=64, BLOCK_M=192, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal, DTYPE=dtype,
                    Q_ROWS=64, KV_ROWS=block_n, CONSUMERS=3, OVERLAP=overlap, LOADER_REGS=24,
                    CONSUMER_REGS=hopper.FORWARD_CONSUMER_REGS[3]), 4)
    # Four consumer warpgroups of 64 rows at d64 (FLASHTILE_GLUON_FWD_CONSUMERS=4): 256-row tiles of
    # 64-key tiles, each tile's products in turn, a program per tile and persistent.
    block_n, stages = getattr(hopper, "FORWARD_FOUR_CONSUMER_TILES", (None, None))
    for causal, persistent in [] if block_n is None else [(True, True)] if quick else [
            (False, False), (True, False), (False, True), (True, True)]:
        four = dict(HEAD_DIM=64, BLOCK_M=256, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal, DTYPE="bf16",
                    Q_ROWS=64, KV_ROWS=block_n, CONSUMERS=4, OVERLAP=False, LOADER_REGS=24,
                    CONSUMER_REGS=hopper.FORWARD_CONSUMER_REGS[4])
        if persistent:
            four.update(PERSISTENT=True, Q_BUFFERS=hopper.forward_q_buffers(64, 256, block_n, stages))
        yield (f"gluon fwd4 d=64 {'causal' if causal else 'full'} bf16 s{stages} in turn"
               f"{' persistent' if persistent else ''}", gluon_fwd._fwd_pingpong_kernel, four, 4)
        # (and the loader's coordinates for the consumers, EARLY_COORDS: the four consumers' 112 registers)
        if (persistent and not quick and not causal
                and "EARLY_COORDS" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters):
            yield (f"gluon fwd4 d=64 full bf16 s{stages} in turn persistent early coords",
                   gluon_fwd._fwd_pingpong_kernel, dict(four, EARLY_COORDS=True), 4)
    # Two consumers with each tile's products in turn (a probe's variant, attempt 60). A tree from
    # before OVERLAP (sass_compare.py's dump drops constexprs a kernel lacks) compiles the
    # overlapped order under these "in turn" names: expect them to differ there. The d128 one has
    # P's operand in Q's shape (BLOCK_N = HEAD_DIM), where ptxas 12.8 and 12.9 shared their
    # registers until gluon_fwd._consumer passed Q through the S product's wait (session 28).
    if not quick:
        yield ("gluon fwd d=64 causal bf16 s2 in turn", gluon_fwd._fwd_pingpong_kernel,
               dict(HEAD_DIM=64, BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, CAUSAL=True, DTYPE="bf16", Q_ROWS=64,
                    KV_ROWS=128, OVERLAP=False, **regs), 4)
        yield ("gluon fwd d=128 causal bf16 s2 in turn", gluon_fwd._fwd_pingpong_kernel,
               dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, CAUSAL=True, DTYPE="bf16", Q_ROWS=64,
                    KV_ROWS=128, OVERLAP=False, **regs), 4)
    # Persistent programs (FORWARD_PERSISTENT): one per SM, each taking several Q tiles, the next
    # tile's Q in a second buffer where shared memory holds it (hopper.forward_q_buffers).
    if "PERSISTENT" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters:
        three = dict(HEAD_DIM=64, BLOCK_M=192, BLOCK_N=128, NUM_STAGES=2, Q_ROWS=64, KV_ROWS=128, CONSUMERS=3,
                     OVERLAP=False, LOADER_REGS=24, CONSUMER_REGS=160)
        for name, constexprs in [("fwd3 d=64 causal bf16 s2 in turn", dict(three, CAUSAL=True, DTYPE="bf16")),
                                 ("fwd3 d=64 full fp16 s2 in turn", dict(three, CAUSAL=False, DTYPE="fp16")),
                                 ("fwd d=128 causal bf16 s2", dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128,
                                                                   NUM_STAGES=2, CAUSAL=True, DTYPE="bf16",
                                                                   Q_ROWS=64, KV_ROWS=128, **regs)),
                                 ("fwd d=256 full bf16 s2", dict(HEAD_DIM=256, BLOCK_M=128, BLOCK_N=64, NUM_STAGES=2,
                                                                 CAUSAL=False, DTYPE="bf16", Q_ROWS=64, KV_ROWS=64,
                                                                 **regs)),
                                 ("fwd d=128 full bf16 s3", dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128,
                                                                 NUM_STAGES=3, CAUSAL=False, DTYPE="bf16",
                                                                 Q_ROWS=64, KV_ROWS=128, **regs)),
                                 ("fwd d=64 causal bf16 s2", dict(HEAD_DIM=64, BLOCK_M=128, BLOCK_N=128,
                                                                  NUM_STAGES=2, CAUSAL=True, DTYPE="bf16",
                                                                  Q_ROWS=64, KV_ROWS=128, **regs)),
                                 ][:1 if quick else None]:
            buffers = hopper.forward_q_buffers(constexprs["HEAD_DIM"], constexprs["BLOCK_M"],
                                               constexprs["BLOCK_N"], constexprs["NUM_STAGES"])
            yield (f"gluon {name} persistent q{buffers}", gluon_fwd._fwd_pingpong_kernel,
                   dict(constexprs, PERSISTENT=True, Q_BUFFERS=buffers), 4)
            # the dynamic scheduler on every persistent config (Q_BUFFERS 1 and 2)
            if "TileCounter" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters:
                yield (f"gluon {name} persistent q{buffers} dynamic", gluon_fwd._fwd_pingpong_kernel,
                       dict(constexprs, PERSISTENT=True, Q_BUFFERS=buffers, DYNAMIC=True), 4)
            # each item's coordinates written by the loader beside its Q (EARLY_COORDS), in fixed turns
            # and (but in the quick set) on the dynamic scheduler
            if "EARLY_COORDS" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters:
                for dynamic in (False,) if quick else (False, True):
                    yield (f"gluon {name} persistent q{buffers}{' dynamic' if dynamic else ''} early coords",
                           gluon_fwd._fwd_pingpong_kernel,
                           dict(constexprs, PERSISTENT=True, Q_BUFFERS=buffers, EARLY_COORDS=True,
                                **({"DYNAMIC": True} if dynamic else {})), 4)
            # one Q buffer: the next tile's first K/V tiles copied before the wait for it (EARLY_KV)
            if buffers == 1 and "EARLY_KV" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters:
                for dynamic in (False, True):
                    yield (f"gluon {name} persistent q1 early kv{' dynamic' if dynamic else ''}",
                           gluon_fwd._fwd_pingpong_kernel,
                           dict(constexprs, PERSISTENT=True, Q_BUFFERS=1, EARLY_KV=True,
                                **({"DYNAMIC": True} if dynamic else {})), 4)
        # The consumers' timeline (Trace; probes/fwd_timeline.py)
        if not quick and "Trace" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters:
            yield ("gluon fwd3 d=64 full bf16 s2 in turn persistent traced", gluon_fwd._fwd_pingpong_kernel,
                   dict(three, CAUSAL=False, DTYPE="bf16", PERSISTENT=True, Q_BUFFERS=2, TRACE=True), 4)
            if "EARLY_COORDS" in inspect.signature(gluon_fwd._fwd_pingpong_kernel.fn).parameters:
                yield ("gluon fwd3 d=64 full bf16 s2 in turn persistent traced early coords",
                       gluon_fwd._fwd_pingpong_kernel, dict(three, CAUSAL=False, DTYPE="bf16", PERSISTENT=True,
                                                            Q_BUFFERS=2, TRACE=True, EARLY_COORDS=True), 4)
    yield from listed_variants(gluon_fwd, quick, regs)
    for d, causal, dtype in [(128, True, "bf16")] if quick else [(128, False, "bf16"), (128, True, "fp16"),
                                                                    (64, True, "bf16")]:
        (m, n, stages), (dq_m, dq_n, dq_stages) = hopper.BWD_DKDV[d], hopper.BWD_DQ[d]
        mode = "causal" if causal else "full"
        yield (f"gluon dkdv d={d} {mode} {dtype} s{stages}", gluon_bwd._dkdv_kernel,
               dict(HEAD_DIM=d, BLOCK_M=m, BLOCK_N=n, NUM_STAGES=stages, CAUSAL=causal, DTYPE=dtype, Q_ROWS=m,
                    KV_ROWS=n // 2, **regs), 4)
        yield (f"gluon dq d={d} {mode} {dtype} s{dq_stages}", gluon_bwd._dq_kernel,
               dict(HEAD_DIM=d, BLOCK_M=dq_m, BLOCK_N=dq_n, NUM_STAGES=dq_stages, CAUSAL=causal, DTYPE=dtype,
                    ROW_STATS=quick or not causal or d == 64, HAS_DLSE=d == 64, Q_ROWS=dq_m // 2, KV_ROWS=dq_n,
                    **regs), 4)
    for causal, dtype in [(True, "bf16")] if quick else [(True, "bf16"), (False, "fp16")]:
        (m, n, stages), (dq_m, dq_n, dq_stages) = hopper.BWD_DKDV[256], hopper.BWD_DQ[256]
        mode = "causal" if causal else "full"
        yield (f"gluon dkdv wide d=256 {mode} {dtype} s{stages}", gluon_bwd_wide._dkdv_wide_kernel,
               dict(HEAD_DIM=256, BLOCK_M=m, BLOCK_N=n, NUM_STAGES=stages, P_BUFFERS=hopper.WIDE_P_BUFFERS,
                    CAUSAL=causal, DTYPE=dtype, Q_ROWS=m, KV_ROWS=n, **regs), 4)
        yield (f"gluon dq d=256 {mode} {dtype} s{dq_stages}", gluon_bwd._dq_kernel,
               dict(HEAD_DIM=256, BLOCK_M=dq_m, BLOCK_N=dq_n, NUM_STAGES=dq_stages, CAUSAL=causal, DTYPE=dtype,
                    ROW_STATS=True, HAS_DLSE=not causal, Q_ROWS=dq_m // 2, KV_ROWS=dq_n, **regs), 4)
    # The five-product backward: with Gluon's TMA reduction (Triton 3.8+), and as the TMA store
    # that tma_reduce_ptx.py rewrites into it (what runs before 3.8; here under any Triton, so that
    # CI's ptxas assembles the rewritten instruction too).
    native = hopper._gluon_common().HAS_TMA_REDUCE
    # (head dim, causal, dtype, reduction by PTX, Q tiles last first, tail split, EXP_POLY[, DEFER_DK]):
    # DEFER_DK as auto sets it where the case does not say
    quick_cases = [(128, True, "bf16", False, False, False, 0), (64, False, "bf16", True, False, False, 0),
                   (64, True, "bf16", False, False, False, 2), (64, True, "bf16", True, False, False, 0, False)]
    cases = quick_cases if quick else [
        (128, True, "bf16", False, False, False, 0), (128, False, "fp16", False, False, False, 0),
        (64, True, "bf16", False, False, False, 0), (64, False, "bf16", False, False, False, 0),
        (128, False, "bf16", True, False, False, 0), (64, True, "fp16", True, False, False, 0),
        (128, True, "bf16", False, True, False, 0), (64, True, "bf16", True, True, False, 0),
        (128, False, "bf16", False, False, True, 0), (64, False, "bf16", True, False, True, 0),
        (128, True, "bf16", False, True, False, 1), (64, False, "fp16", False, False, False, 2),
        (64, False, "bf16", True, False, False, 0, False), (64, True, "bf16", True, False, False, 0, False),
        (128, False, "bf16", True, False, False, 0, True), (128, True, "bf16", True, True, False, 0, False)]
    for d, causal, dtype, by_ptx, descending, tail, poly, *forced in cases:
        by_ptx = by_ptx or not native
        m, n, stages = hopper.BWD_FUSED[d]
        defer = forced[0] if forced else _defer_dk(hopper, d, causal)
        yield (f"gluon fused dkdv+dq d={d} {'causal' if causal else 'full'} {dtype} s{stages}"
               f"{' ptx-reduce' if by_ptx else ''}{' q-descending' if descending else ''}"
               f"{' tail-split' if tail else ''}{f' exp-poly{poly}' if poly else ''}{' defer-dk' if defer else ''}",
               hopper._fused_module()._dkdv_dq_kernel,
               dict(HEAD_DIM=d, BLOCK_M=m, BLOCK_N=n, NUM_STAGES=stages, CAUSAL=causal, REDUCE_BY_PTX=by_ptx,
                    Q_DESCENDING=descending, TAIL_SPLIT=tail, EXP_POLY=poly,
                    HOIST_STATS=_hoist_stats(hopper, d, causal), DTYPE=dtype, Q_ROWS=m, KV_ROWS=n // 2,
                    DEFER_DK=defer, **regs), 4)
    # Its persistent programs (attempt 76), as auto would set the rest; not in trees from before them.
    if "PERSISTENT" not in inspect.signature(hopper._fused_module()._dkdv_dq_kernel.fn).parameters:
        return
    persistent_cases = [(64, False, "bf16", True), (128, True, "bf16", False)] if quick else [
        (64, False, "bf16", False), (64, True, "bf16", False), (128, False, "fp16", False), (128, True, "bf16", False),
        (64, False, "bf16", True), (128, True, "bf16", True)]
    for d, causal, dtype, by_ptx in persistent_cases:
        by_ptx = by_ptx or not native
        m, n, stages = hopper.BWD_FUSED[d]
        descending = causal and hopper.FUSED_Q_DESCENDING.get(d, False)
        defer = _defer_dk(hopper, d, causal)
        yield (f"gluon fused dkdv+dq d={d} {'causal' if causal else 'full'} {dtype} s{stages}"
               f"{' ptx-reduce' if by_ptx else ''}{' q-descending' if descending else ''}"
               f"{' defer-dk' if defer else ''} persistent",
               hopper._fused_module()._dkdv_dq_kernel,
               dict(HEAD_DIM=d, BLOCK_M=m, BLOCK_N=n, NUM_STAGES=stages, CAUSAL=causal, REDUCE_BY_PTX=by_ptx,
                    Q_DESCENDING=descending, TAIL_SPLIT=False, EXP_POLY=0, HOIST_STATS=_hoist_stats(hopper, d, causal),
                    DTYPE=dtype, Q_ROWS=m, KV_ROWS=n // 2, DEFER_DK=defer, PERSISTENT=True, **regs), 4)
    # without the meeting after a key tile (attempt 78; not in trees from before it)
    if "SKIP_END_MEETING" not in inspect.signature(hopper._fused_module()._dkdv_dq_kernel.fn).parameters:
        return
    for causal in [False] if quick else [False, True]:
        m, n, stages = hopper.BWD_FUSED[64]
        defer = _defer_dk(hopper, 64, causal)
        yield (f"gluon fused dkdv+dq d=64 {'causal' if causal else 'full'} bf16 s{stages}"
               f"{' ptx-reduce' if not native else ''}{' defer-dk' if defer else ''} persistent no-end-meeting",
               hopper._fused_module()._dkdv_dq_kernel,
               dict(HEAD_DIM=64, BLOCK_M=m, BLOCK_N=n, NUM_STAGES=stages, CAUSAL=causal, REDUCE_BY_PTX=not native,
                    Q_DESCENDING=False, TAIL_SPLIT=False, EXP_POLY=0, HOIST_STATS=_hoist_stats(hopper, 64, causal),
                    DTYPE="bf16", Q_ROWS=m, KV_ROWS=n // 2, DEFER_DK=defer, PERSISTENT=True, SKIP_END_MEETING=True,
                    **regs), 4)
    # on the dynamic scheduler (attempt 79: a counter the grid shares; not in trees from before it)
    if "TileCounter" not in inspect.signature(hopper._fused_module()._dkdv_dq_kernel.fn).parameters:
        return
    for d in [128] if quick else [128, 64]:
        m, n, stages = hopper.BWD_FUSED[d]
        descending = hopper.FUSED_Q_DESCENDING.get(d, False)
        defer = _defer_dk(hopper, d, True)
        yield (f"gluon fused dkdv+dq d={d} causal bf16 s{stages}{' ptx-reduce' if not native else ''}"
               f"{' q-descending' if descending else ''}{' defer-dk' if defer else ''} persistent dynamic",
               hopper._fused_module()._dkdv_dq_kernel,
               dict(HEAD_DIM=d, BLOCK_M=m, BLOCK_N=n, NUM_STAGES=stages, CAUSAL=True, REDUCE_BY_PTX=not native,
                    Q_DESCENDING=descending, TAIL_SPLIT=False, EXP_POLY=0, HOIST_STATS=_hoist_stats(hopper, d, True),
                    DTYPE="bf16", Q_ROWS=m, KV_ROWS=n // 2, DEFER_DK=defer, PERSISTENT=True, DYNAMIC=True,
                    **regs), 4)


def _defer_dk(hopper, head_dim: int, causal: bool) -> bool:
    """Whether auto leaves a fused variant's dK product in flight (hopper.FUSED_DEFER_DK; False in
    trees from before it, which sass_compare.py may be dumping)."""
    return hopper.FUSED_DEFER_DK.get((head_dim, causal), False) if hasattr(hopper, "FUSED_DEFER_DK") else False


def _hoist_stats(hopper, head_dim: int, causal: bool) -> bool:
    """FUSED_HOIST_STATS's entry for a fused variant: keyed by head dim alone in trees of session 21,
    by (head dim, causal) since (sass_compare.py may be dumping either)."""
    table = hopper.FUSED_HOIST_STATS
    return table.get((head_dim, causal), table.get(head_dim, False))


def listed_variants(gluon_fwd, quick: bool, regs: dict):
    """The block-sparse Gluon forward with masks of each kind: generated (causal), reading a
    tensor (document ids), combined (and_masks), and a user's function."""
    import torch

    from flashtile import mask_mods

    def user_mask(b, h, q_idx, kv_idx):
        return ((q_idx // 7 + h) % 3 != 0) | (kv_idx <= q_idx)

    document = mask_mods.document_mask(torch.zeros(16, dtype=torch.int32))
    window = mask_mods.and_masks(mask_mods.causal_mask(), mask_mods.sliding_window_mask(200))
    cases = [(128, 128, "causal", mask_mods.causal_mask(), "bf16")] if quick else [
        (128, 128, "causal", mask_mods.causal_mask(), "bf16"), (128, 64, "document", document, "bf16"),
        (64, 64, "user", mask_mods.mask_mod(user_mask), "fp16"), (256, 64, "causal window", window, "bf16")]
    from flashtile.kernels import hopper

    for d, block_n, name, mask, dtype in cases:
        stages = hopper._listed_stages(d, block_n, 16384)
        yield (f"gluon fwd listed d={d} n={block_n} {name} {dtype} s{stages}", gluon_fwd._fwd_listed_kernel,
               dict(HEAD_DIM=d, BLOCK_M=128, BLOCK_N=block_n, NUM_STAGES=stages, MASK_MOD=mask.triton_fn(),
                    DTYPE=dtype, Q_ROWS=64, KV_ROWS=block_n, **regs), 4)
    gluon_bwd = hopper._gluon()[3]
    keys = hopper.LISTED_BACKWARD_KEYS
    backward_cases = [(d, name, mask, dtype) for d, _, name, mask, dtype in cases if d <= 128]
    for d, name, mask, dtype in backward_cases[:1 if quick else 3]:
        stages = hopper.LISTED_DKDV_STAGES
        yield (f"gluon dkdv listed d={d} {name} {dtype} s{stages}", gluon_bwd._dkdv_listed_kernel,
               dict(HEAD_DIM=d, BLOCK_M=keys, BLOCK_N=128, NUM_STAGES=stages, MASK_MOD=mask.triton_fn(), DTYPE=dtype,
                    Q_ROWS=keys, KV_ROWS=64, **regs), 4)
        stages = hopper.LISTED_DQ_STAGES
        yield (f"gluon dq listed d={d} {name} {dtype} s{stages}", gluon_bwd._dq_listed_kernel,
               dict(HEAD_DIM=d, BLOCK_M=128, BLOCK_N=keys, NUM_STAGES=stages, MASK_MOD=mask.triton_fn(), DTYPE=dtype,
                    ROW_STATS=name != "causal", HAS_DLSE=name == "user", Q_ROWS=64, KV_ROWS=keys, **regs), 4)


# The attention kernels' option flags with every option off (tile sizes and head dims apart).
PLAIN = dict(HAS_LEFT=False, HAS_RIGHT=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_BIAS=False, HAS_DROPOUT=False,
             IS_VARLEN=False, DOT_PRECISION="ieee", MASK_MOD=None, SCORE_MOD=None, SCORE_GRAD=None, USE_TMA=False)


def variants(quick: bool):
    from flashtile.mask_mods import and_masks, causal_mask, document_mask
    from flashtile.score_mods import softcap_score

    import torch

    mask = and_masks(causal_mask(), document_mask(torch.zeros(8, dtype=torch.int32))).triton_fn()
    score, score_grad = softcap_score(20.0).triton_fns()
    flags = dict(PLAIN, HAS_RIGHT=True)
    every = dict(PLAIN, HAS_LEFT=True, HAS_RIGHT=True, HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_BIAS=True,
                 HAS_DROPOUT=True, IS_VARLEN=True)
    masked = dict(flags, HAS_RIGHT=False, MASK_MOD=mask, SCORE_MOD=score, SCORE_GRAD=score_grad, FULL_RANGE=True)
    dims = [(128, 128)] if quick else [(128, 128), (40, 64), (256, 256)]
    for d, dp in dims:
        for name, f in ([("causal", flags), ("mask_mod+score_mod", masked)] if quick else
                        [("causal", flags), ("every option", every), ("mask_mod+score_mod", masked),
                         ("mask_mod runs", dict(masked, FULL_RANGE=False))]):
            yield (f"fwd d={d} {name}", _fwd_kernel,
                   dict(HEAD_DIM=d, HEAD_DIM_PADDED=dp, BLOCK_M=128, BLOCK_N=64 if d > 128 else 128, **f), 8, 2)
            if not f["IS_VARLEN"]:  # K/V through tensor descriptors (FLASHTILE_TMA=1): dense batches only,
                # at 3 stages (1 at d256) as kernels/tma.py keeps Triton 3.6 off 2
                yield (f"fwd d={d} {name} tma", _fwd_kernel,
                       dict(HEAD_DIM=d, HEAD_DIM_PADDED=dp, BLOCK_M=128, BLOCK_N=64 if d > 128 else 128,
                            **dict(f, USE_TMA=True)), 8, 1 if d > 128 else 3)
            for tma in (False, True) if not f["IS_VARLEN"] else (False,):
                stages = (1 if d > 128 else 3) if tma else 2
                yield (f"dkdv d={d} {name}{' tma' if tma else ''}", _bwd_dkdv_kernel,
                       dict(HEAD_DIM=d, HEAD_DIM_PADDED=dp, BLOCK_M=64 if d <= 128 else 32,
                            BLOCK_N=128 if d <= 128 else 64, **dict(f, USE_TMA=tma)), 8, stages)
                yield (f"dq d={d} {name}{' tma' if tma else ''}", _bwd_dq_kernel,
                       dict(HEAD_DIM=d, HEAD_DIM_PADDED=dp, BLOCK_M=128 if d <= 128 else 32, BLOCK_N=64,
                            HAS_DBIAS=f["HAS_BIAS"], **dict(f, USE_TMA=tma)), 8, stages)
    no_sum = dict(DqSum=None, Counter=None, DQ_SUM_WIDTH=0)  # (as the launches without a dQ sum pass them)
    yield ("preprocess", _bwd_preprocess, dict(HEAD_DIM=128, HEAD_DIM_PADDED=128, BLOCK_M=64, HAS_DLSE=True,
                                               IS_VARLEN=True, PADDED=False, **no_sum), 4, 1)
    yield ("preprocess padded", _bwd_preprocess, dict(HEAD_DIM=128, HEAD_DIM_PADDED=128, BLOCK_M=64, HAS_DLSE=True,
                                                      IS_VARLEN=False, PADDED=True, **no_sum), 4, 1)
    yield ("preprocess padded, dQ sum and counter zeroed", _bwd_preprocess,
           dict(HEAD_DIM=128, HEAD_DIM_PADDED=128, BLOCK_M=64, HAS_DLSE=False, IS_VARLEN=False, PADDED=True,
                DQ_SUM_WIDTH=128), 4, 1)
    yield ("padding fill", _fill_rows_outside_kernel, dict(BLOCK_R=8, BLOCK_C=512), 4, 1)
    for paged in (False, True):
        yield (f"append k/v paged={paged}", _append_kv_kernel,
               dict(PAGED=paged, HAS_BATCH_IDX=not paged, BLOCK_H=8, BLOCK_D=128), 4, 1)
    yield ("combine splits", _combine_splits_kernel, dict(HEAD_DIM=128, HEAD_DIM_PADDED=128, SPLITS_PADDED=64), 4, 1)
    for paged in (False, True):
        yield (f"decode paged={paged}", _decode_kernel,
               dict(HEAD_DIM=128, HEAD_DIM_PADDED=128, BLOCK_M=16, BLOCK_N=64, HAS_LEFT=False, HAS_RIGHT=True,
                    HAS_SOFTCAP=not paged, HAS_ALIBI=paged, PAGED=paged, HAS_BATCH_IDX=not paged,
                    HAS_LEFTPAD=True, DOT_PRECISION="ieee"), 4, 3)


def smem_cases():
    """(name, kernel, constexprs, warps, stages, estimate) for the H200 table's deepest
    pipelines with the options that add shared memory (bias tile, dropout's keep mask):
    the configs' fit (kernels/configs.py) trusts this estimate to stay under the device limit."""
    from flashtile.kernels.configs import KernelConfig, _smem_bytes

    # The bias's last stride is 1 on a launch (Triton specialises it) and its rows are
    # not 16-aligned in general (a key length like 777).
    bias = dict(HAS_BIAS=True, stride_bn=1)
    for name, kernel, (bm, bn, warps, stages), d, streams_keys, resident, options in [
        ("fwd", _fwd_kernel, (128, 128, 8, 3), 128, True, 1, dict(HAS_DROPOUT=True)),
        ("fwd", _fwd_kernel, (128, 128, 8, 2), 128, True, 1, dict(bias, HAS_DROPOUT=True)),
        ("fwd", _fwd_kernel, (64, 64, 4, 3), 64, True, 1, dict(HAS_DROPOUT=True)),
        ("dkdv", _bwd_dkdv_kernel, (64, 128, 8, 3), 128, False, 2, dict(bias, HAS_DROPOUT=True)),
        ("dkdv", _bwd_dkdv_kernel, (128, 64, 8, 3), 128, False, 2, {}),
        ("dq", _bwd_dq_kernel, (128, 64, 8, 3), 128, True, 2, dict(HAS_DROPOUT=True)),
    ]:
        flags = dict(PLAIN, HEAD_DIM=d, HEAD_DIM_PADDED=d, HAS_RIGHT=True, HAS_DBIAS=False, BLOCK_M=bm, BLOCK_N=bn,
                     **options)
        estimate = _smem_bytes(KernelConfig(bm, bn, warps, stages), d, 2, streams_keys, resident,
                               bias_elem=2 if options.get("HAS_BIAS") else 0, dropout=options.get("HAS_DROPOUT", False))
        label = f"{name} d={d} {bm}x{bn} w{warps} s{stages} {'+'.join(k for k in options if k.startswith('HAS'))}"
        yield label, kernel, flags, warps, stages, estimate


def check_smem_estimates() -> int:
    failures = 0
    for name, kernel, constexprs, warps, stages, estimate in smem_cases():
        actual = compile_variant(kernel, constexprs, warps, stages).metadata.shared
        ok = actual <= estimate
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:44s} triton={actual:7d} B  estimate={estimate:7d} B", flush=True)
    print(f"{failures} estimates too low" if failures else "every shared-memory estimate covers Triton's")
    return 1 if failures else 0


def cuobjdump(compiled, flag: str, check: bool = True) -> str:
    """cuobjdump's report on a compiled kernel's cubin (``flag``: "-res-usage", "-sass"; the
    tool ships with Triton's NVIDIA backend); ``check``: raise when it fails."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([tool, flag, cubin.name], capture_output=True, text=True, check=check).stdout


def resource_usage(compiled) -> str:
    """Registers per thread and stack (spill) bytes of a compiled kernel, from the cubin,
    e.g. "regs=255 stack=1688"."""
    report = cuobjdump(compiled, "-res-usage", check=False)  # a failed report reads "?"
    regs, stack = re.search(r"REG:(\d+)", report), re.search(r"STACK:(\d+)", report)
    return f"regs={regs.group(1) if regs else '?'} stack={stack.group(1) if stack else '?'}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--resources", action="store_true",
                        help="also print registers and stack (spill) bytes per variant")
    parser.add_argument("--smem", action="store_true",
                        help="check the config fit's shared-memory estimate against Triton's (see smem_cases)")
    parser.add_argument("--only", metavar="TEXT", help="only the variants whose name contains TEXT")
    args = parser.parse_args(argv)
    if args.smem:
        return check_smem_estimates()
    failures = 0
    everything = [*variants(args.quick), *((*g, None) for g in gluon_variants(args.quick))]
    if args.only:
        everything = [variant for variant in everything if args.only in variant[0]]
    for name, kernel, constexprs, warps, stages in everything:
        start = time.perf_counter()
        try:
            compiled = (compile_variant(kernel, constexprs, warps, stages) if stages is not None
                        else compile_gluon_variant(kernel, constexprs, warps))
        except Exception as err:  # noqa: BLE001 - report every failing variant, then fail
            failures += 1
            print(f"FAIL {name}: {type(err).__name__}: {str(err).splitlines()[-1][:200]}", flush=True)
            continue
        # The dense Gluon forward's register operands: none that P V leaves for Q Kᵀ to read as Q
        # (ptxas of CUDA 12.8 did on 64-key tiles, session 28: tools/sass_operands.py).
        clashes = sass_operands.clashes(cuobjdump(compiled, "-sass")) if name.startswith("gluon fwd") else []
        if clashes:
            failures += 1
            print(f"FAIL {name}: {clashes[0]}", flush=True)
            continue
        ptx = compiled.asm["ptx"]
        extra = f"  {resource_usage(compiled)}" if args.resources else ""
        print(f"ok   {name:28s} {time.perf_counter() - start:5.1f} s  wgmma={'wgmma' in ptx}  "
              f"smem={compiled.metadata.shared // 1024} KiB{extra}", flush=True)
    print(f"{failures} failed" if failures else "all kernels compile for sm_90")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
