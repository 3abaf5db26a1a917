"""When and how attention takes the Gluon kernels (Hopper, sm_90): gluon_fwd.py for the
forward, gluon_bwd.py for the backward (with gluon_bwd_wide.py's dK/dV kernel at head dim 256).

They cover plain attention, causal or not, with GQA, in bf16/fp16, on tensors TMA can
address: head dims 64, 128 and 256, forward and backward. Every other call runs the Triton
kernels. ``FLASHTILE_GLUON`` (forward) and ``FLASHTILE_GLUON_BWD`` (backward) choose:

- ``auto`` (the default): Gluon where the H200 measured it faster than the Triton kernels
  (docs/performance.md, sessions 9 to 13): the forward at head dims 128 and 256, and at 64 from
  4k keys; the backward at 64, 128 and 256; of the head dims run padded, 40, 96 and 192 both
  ways (the d192 causal forward from 4k keys);
- ``1``: Gluon for every call it covers (the tests use this to reach every shape);
- ``0``: never.

Where Triton's Gluon has TMA reductions (3.8 and newer), the backward at head dims 64 and 128
can run gluon_bwd_fused.py's one kernel of five products per tile pair, dQ added in float32 in
the order the CTAs reach it, instead of gluon_bwd.py's two kernels of seven, every output with
one writer. ``FLASHTILE_GLUON_BWD_FUSED`` chooses among the Gluon backwards the same way (auto,
1, 0; auto takes it at d64 and d128 where fused_measured_faster says); a call that asks for a deterministic
backward (``deterministic=True``, or ``torch.use_deterministic_algorithms(True)``) always gets the
seven-product kernels.

A call with a block mask (mask_mod) of 128-row Q tiles runs the block-sparse Gluon kernels:
the forward (gluon_fwd) with 64- or 128-key K/V tiles, the backward (gluon_bwd) with 64-key
backward tiles at head dims up to 128; under auto where ``LISTED_UNDER_AUTO`` says.

Under ``auto`` a Gluon kernel that fails to build here (a Triton whose Gluon changed, a
ptxas error) sends its calls back to the Triton kernels, with one warning naming the error;
under ``1`` the error is raised.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from typing import NamedTuple

import torch
import triton

try:
    from triton.errors import TritonError  # the base of compile, ptxas and resource errors (3.x)
except ImportError:  # an older Triton: no Gluon kernels run there anyway (_gluon() is None)
    TritonError = RuntimeError

from ..backends import compute_capability, cuda_index, interpreting, sm_count
from ..masks import Band
from . import bwd, fast_launch, tma, tma_reduce_ptx
from .common import LOG2E as _LOG2E_CONSTEXPR
from .common import cdiv, padded_head_dim

LOG2E = _LOG2E_CONSTEXPR.value  # the kernels' log2(e) as a float, for the scale the host works out
BLOCK_M = 128  # two consumer warpgroups of 64 rows


SETTINGS = ("auto", "1", "0")
_WORDS = {"true": "1", "on": "1", "yes": "1", "false": "0", "off": "0", "no": "0"}
# What a kernel that cannot be built here raises: Triton's compile, ptxas and resource errors
# (a Gluon API that moved inside a kernel surfaces as a CompilationError), MLIR's pass failure
# (a plain RuntimeError), and the Python errors of a Gluon host API that moved (a renamed class
# or argument in this file). A TypeError or AttributeError of our own making is caught too
# under auto: the GPU tests run with the switches at 1, where nothing is caught.
BUILD_ERRORS = (TritonError, AttributeError, TypeError, ImportError)
_PASS_FAILURE = "PassManager::run failed"
# Kernels that failed to build here, by (pass, head dim, dtype, causal): auto sends them to
# Triton. (Pipeline depth is not in the key: one depth failing turns off the others too.)
_FAILED: set = set()


def _switch(backward: bool) -> str:
    """The environment variable that chooses the forward's or the backward's kernels."""
    return "FLASHTILE_GLUON_BWD" if backward else "FLASHTILE_GLUON"


def setting(backward: bool = False, name: str | None = None) -> str:
    """``FLASHTILE_GLUON`` (forward), ``FLASHTILE_GLUON_BWD`` (backward) or the switch ``name``:
    auto, 1 or 0 (true/on/yes and false/off/no are read as 1 and 0)."""
    name = name or _switch(backward)
    value = os.environ.get(name, "auto").strip().lower() or "auto"
    value = _WORDS.get(value, value)
    if value not in SETTINGS:
        raise ValueError(f"{name}: expected one of {', '.join(SETTINGS)}, got {os.environ[name]!r}")
    return value


def switched(name: str, under_auto: bool) -> bool:
    """The on/off switch ``name``: ``under_auto`` (what the H200 measured) where it is auto, else
    its 1 or 0."""
    value = setting(name=name)
    return under_auto if value == "auto" else value == "1"


def choice(name: str, allowed: tuple[str, ...], what: str = "") -> str:
    """The switch ``name`` that takes auto (also unset or empty) or one of ``allowed``; ``what``
    (e.g. "bytes") goes in the error's list."""
    raw = os.environ.get(name, "auto")
    value = raw.strip().lower() or "auto"
    if value != "auto" and value not in allowed:
        listed = f"auto, {', '.join(allowed[:-1])} or {allowed[-1]}{f' ({what})' if what else ''}"
        raise ValueError(f"{name}: expected {listed}, got {raw!r}")
    return value


# The head dims the kernels are built for; a call of another head dim up to 256 runs the
# smallest that holds it, its extra columns zero: TMA fills the columns past the tensor's last
# dim with zeros on a load (so Q Kᵀ, P V and the gradients' products are exact) and leaves them
# out of a store.
KERNEL_HEAD_DIMS = (64, 128, 256)


def kernel_head_dim(head_dim: int) -> int | None:
    """The head dim of the kernel that runs a call of ``head_dim`` (e.g. 96 -> 128, 192 -> 256),
    or None past 256."""
    return next((d for d in KERNEL_HEAD_DIMS if d >= head_dim), None)


def measured_faster(head_dim: int, seqlen_k: int, backward: bool, causal: bool = False,
                    block_sparse: bool = False) -> bool:
    """Where the Gluon kernels beat the Triton ones on the H200, each measured through
    ``flashtile.attention`` as a user calls it (bf16, 16k tokens; docs/performance.md, sessions
    9 and 10, has the figures). Forward: d128 and d256 at every length (non-causal 1.2-1.6x the
    Triton forward in session 9); at 1k both paths are host-bound and the Gluon call has also
    read below the Triton one (session 10, d256: 282 against 357 TFLOP/s), which its kernel
    alone never does. d64 from 4k keys, and from 1k where it runs on persistent programs
    (forward_persistent; session 24: at 1k, 421 / 267 TFLOP/s non-causal / causal in flashtile
    bench, against the Triton forward's 370 / 255 in that session's grid); below 4k a program
    per tile and the Triton forward trade places between runs, and the block-sparse forward
    (``block_sparse``) has no persistent programs. Backward:
    every head dim at every length; the one cell where it trailed in a run, d128 causal at 1k,
    is host-bound and scatters between runs on either side of the Triton backward. d256 (session
    11, gluon_bwd_wide): 377 / 443 / 436 TFLOP/s non-causal at 1k / 4k / 16k and 273 / 389 / 432
    causal, against the Triton backward's 198 / 224 / 228 and 142 / 187 / 209.

    Head dims the kernels run padded (session 12, probes/padded_head_dims.py, TFLOP/s of the
    call's own head dim, Gluon against Triton, non-causal then causal at 1k / 4k / 16k): d96
    forward 418 / 512 / 478, 302 / 443 / 461 against 279 / 340 / 361, 215 / 286 / 333, backward
    326 / 371 / 366, 255 / 350 / 362 against 247 / 300 / 310, 171 / 246 / 281; d192 forward
    466 / 520 / 514, 165 / 473 / 523 against 278 / 340 / 340, 207 / 292 / 345 (so causal from
    4k keys), backward about twice Triton's; d40 forward 151-286 against 55-85. Session 13,
    d40 backward 200 / 252 / 263, 144 / 222 / 246 against 60 / 69 / 72, 44 / 62 / 69. Other
    padded head dims (e.g. 80, 160) have not been timed."""
    if head_dim in KERNEL_HEAD_DIMS:
        if backward or head_dim in (128, 256) or seqlen_k >= 4096:
            return True
        return seqlen_k >= 1024 and not block_sparse and forward_persistent(head_dim, seqlen_k, causal)
    if head_dim == 192 and not backward:
        return not causal or seqlen_k >= 4096
    return head_dim in (40, 96, 192)


@functools.lru_cache(maxsize=None)
def _gluon():
    """The kernel modules (forward, Gluon's language, the descriptor class, backward, wide
    backward), or None where this
    Triton's Gluon is older than the kernel: 3.5 has every name imported here, but its
    ``warp_specialize`` takes other arguments, so 3.6 is the first the kernel builds with."""
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        return None
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from . import gluon_bwd, gluon_bwd_wide, gluon_fwd
    except (ImportError, AttributeError):  # absent, or an older Gluon without these names
        return None
    return gluon_fwd, gl, TensorDescriptor, gluon_bwd, gluon_bwd_wide


@functools.lru_cache(maxsize=None)
def _fused_module():
    """gluon_bwd_fused.py, imported on its first use (it needs only what _gluon() checked)."""
    from . import gluon_bwd_fused

    return gluon_bwd_fused


@functools.lru_cache(maxsize=None)
def _gluon_common():
    """gluon_common.py (HAS_TMA_REDUCE: whether this Triton's Gluon has TMA reductions)."""
    from . import gluon_common

    return gluon_common


@functools.lru_cache(maxsize=None)
def _unsupported(device_index: int) -> str | None:
    """Why CUDA device ``device_index`` cannot run the Gluon kernels, or None when it can:
    asked once per device, by every eligible() call and by ``flashtile info``."""
    if torch.version.hip is not None:  # ROCm reports MI200 as (9, 0)
        return "a ROCm GPU: the kernels are written for NVIDIA Hopper"
    major, minor = compute_capability(torch.device("cuda", device_index))
    if (major, minor) != (9, 0):  # wgmma and setmaxnreg as on sm_90
        return f"they need compute capability 9.0 (H100/H200); this GPU has {major}.{minor}"
    if _gluon() is None:
        return f"triton {triton.__version__} has no Gluon they build with (3.6 or newer)"
    return None


def availability() -> tuple[bool, str]:
    """Whether this machine can run the Gluon kernels (on the current GPU), and why not."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    reason = _unsupported(torch.cuda.current_device())
    if reason is not None:
        return False, reason
    fused = ("its Gluon has TMA reductions: the five-product backward runs as FLASHTILE_GLUON_BWD_FUSED says"
             if _gluon_common().HAS_TMA_REDUCE else
             ("no TMA reductions in its Gluon: the five-product backward's is a TMA store rewritten in the PTX, "
              + ("under auto where measured faster" if PTX_REDUCE_UNDER_AUTO else
                 "only under FLASHTILE_GLUON_BWD_FUSED=1; auto keeps to seven products")))
    return True, (f"sm_90 and triton {triton.__version__}: plain attention takes them as FLASHTILE_GLUON and "
                  f"FLASHTILE_GLUON_BWD say; {fused}")


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, band: Band, *, softcap: float,
             alibi_slopes, bias, dropout_p: float, varlen, block_mask, score_mod, backward: bool = False,
             grads: tuple = ()) -> bool:
    """Whether this forward call (or with ``backward``, this backward call) can run on the
    Gluon kernels. q/out: (B, Hq, Sq, D), k/v: (B, Hkv, Sk, D), views of any strides;
    ``grads``: the backward's dout, dq, dk, dv, which TMA must address too."""
    if not _device_runs_them(q):
        return False
    choice = setting(backward)  # read here: a typo in it matters only where Gluon could run
    if choice == "0":
        return False
    plain = (softcap == 0 and alibi_slopes is None and bias is None and dropout_p == 0 and varlen is None
             and score_mod is None and band.left is None and band.right in (None, 0))
    if not plain or q.dtype not in DTYPES or kernel_head_dim(q.shape[3]) is None:
        return False
    if block_mask is not None and not _listed_takes(block_mask, q.shape[3], band, backward, choice):
        return False
    if any(t.dtype != q.dtype for t in (k, v, out, *grads)):  # one element type per kernel
        return False
    if q.numel() == 0 or k.numel() == 0:  # the public API rejects these; a direct op call may not
        return False
    mask = block_mask.mask if block_mask is not None else None
    if choice == "auto" and not _auto_takes(q, k.shape[2], backward, band.right == 0, mask,
                                            block_sparse=block_mask is not None):
        return False
    # The device was checked above, once: every tensor here is on q's (the API checks k and v;
    # out and the gradients are made there), so only each one's layout is left to check.
    return all(tma.layout_addressable(t) for t in (q, k, v, out, *grads))


DTYPES = (torch.bfloat16, torch.float16)  # the kernels' element types


def _device_runs_them(q: torch.Tensor) -> bool:
    """Whether q's device runs the Gluon kernels: a CUDA tensor outside the interpreter, on a GPU
    that _unsupported() passes."""
    return not interpreting() and q.is_cuda and _unsupported(cuda_index(q.device)) is None


def _auto_takes(q: torch.Tensor, seqlen_k: int, backward: bool, causal: bool, mask=None,
                block_sparse: bool = False) -> bool:
    """Under auto, whether a call the kernels cover takes them: measured faster at its head dim
    and length (measured_faster; ``block_sparse``: on the block-sparse kernels), and its kernel
    (with ``mask``, the block-sparse one with that MaskMod) not recorded as failing to build here."""
    return (measured_faster(q.shape[-1], seqlen_k, backward, causal=causal, block_sparse=block_sparse)
            and _failure_key(backward, q, causal=causal, mask=mask) not in _FAILED)


def _listed_takes(block_mask, head_dim: int, band: Band, backward: bool, choice: str) -> bool:
    """Whether the block-sparse Gluon kernels take a call with ``block_mask`` (the switch
    ``choice`` already read): the mask alone, no causal band, tiles they run."""
    if band.right is not None or (choice == "auto" and not LISTED_UNDER_AUTO[backward]):
        return False
    return listed_backward_fits(block_mask, head_dim) if backward else listed_tiles_fit(block_mask, head_dim)


_CONSUMER_KERNEL_NAMES = {3: "three-consumer forward", 4: "four-consumer forward"}


def _failure_key(backward: bool, q: torch.Tensor, *, causal: bool, mask=None) -> tuple:
    """What a kernel that failed to build is remembered by: the kernel, head dim, dtype and
    causality, and for the block-sparse kernels the mask_mod (MaskMod) compiled into them, so
    that one mask Gluon cannot build leaves the others on the Gluon kernels; the dense forward on
    three or four consumer warpgroups (forward_consumers) apart from the one on two."""
    kernel = ("block-sparse " if mask is not None else "") + ("backward" if backward else "forward")
    if not backward and mask is None and kernel_head_dim(q.shape[3]) == 64:
        kernel = _CONSUMER_KERNEL_NAMES.get(forward_consumers(64), kernel)
    return (kernel, q.shape[3], q.dtype, causal, mask)


def falls_back(error: BaseException, q: torch.Tensor, *, backward: bool, causal: bool, mask=None) -> bool:
    """Whether a call whose Gluon launch raised ``error`` should run the Triton kernels instead:
    under ``auto``, when the kernel could not be built (BUILD_ERRORS). The kernel (with ``mask``,
    a block mask's MaskMod: the block-sparse one with that mask) is then remembered as broken
    for this process, and a warning says so once."""
    if setting(backward) != "auto" or not _is_build_error(error):
        return False
    key = _failure_key(backward, q, causal=causal, mask=mask)
    if key not in _FAILED:
        _FAILED.add(key)
        name = _switch(backward)
        masked = f", mask_mod {mask.name}" if mask is not None else ""
        warnings.warn(f"flashtile: the Gluon {key[0]} kernel (head dim {key[1]}, {str(key[2])[6:]}, causal={causal}"
                      f"{masked}) "
                      f"failed to build with triton {triton.__version__} ({_error_line(error)}); these "
                      f"calls run the Triton kernels from now on. {name}=0 skips the Gluon kernels, {name}=1 makes "
                      "this an error.", RuntimeWarning, stacklevel=4)
    return True


def _config(head_dim: int, seqlen_k: int) -> tuple[int, int]:
    """(BLOCK_N, NUM_STAGES). d128: from attempt 26's probe (docs/performance.md), 2 stages
    ahead at N = 1k (539 against 521 TFLOP/s), 3 at 4k (586 against 566), even at 16k; session
    9's small-N probe (one timing each, CUDA graphs) had 3 ahead non-causal at 2k and 4k
    (565 / 554 against 525 / 485) and 2 ahead causal at 4k (498 against 445), which a sweep is
    to settle; session 10's sweep (gluon_sweep.py) did not: its differences were within its own
    spread (this rule, 3 stages at 16k, timed 584 TFLOP/s causal; the same 3 stages as a fixed
    config, 619). d64: 2 stages of 128-key tiles, ahead of 3 in every cell of session 10's sweep
    by 1-4% (330 / 396 / 418 against 321 / 388 / 412 non-causal at 1k / 4k / 16k), though not
    in every other timing (session 9's probe: within 1%). d256: 2 stages of 64-key tiles (192 KiB; 3 do not fit)."""
    if head_dim == 128:
        return 128, (3 if seqlen_k >= 4096 else 2)
    if head_dim == 256:
        return 64, 2
    return 128, 2


@functools.lru_cache(maxsize=None)
def _tile_layout(rows: int, head_dim: int, dtype: torch.dtype):
    """The shared-memory layout (swizzle) of a (1, 1, rows, head_dim) tile: built once per shape
    and dtype, since every call needs four of them."""
    gl = _gluon()[1]
    element = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], element)


# The swizzle (bytes) of the five-product backward's float32 dQ staging box. Each consumer thread
# stores its accumulator's column pairs, 8 bytes at (row, 8j + 2t); a half-warp covers rows
# r..r+3 of one 8-column group. TMA's 128-byte swizzle (Triton's default for these boxes) XORs a
# 16-byte chunk's index with row % 8, which for rows 0-3 flips only the two low bits: the two
# chunks of a column group land on the same banks twice (Nsight Compute, session 21: 4
# wavefronts a store where 2 do, 9% of the kernel's shared-memory wavefronts). The 32-byte
# swizzle removes that (ncu then reports no excess), but a box is copied in parts as wide as its
# swizzle, and the reduction's narrower rows cost more than the conflicts (kernels alone, 16k,
# session 21, probes/dq_swizzle.py; non-causal / causal against 128):
#     d128: 64 bytes 0.967 / 0.977, 32 bytes 0.913 / 0.906, unswizzled (4-way conflicts) 0.908 / 0.917;
#     d64:  64 bytes 1.000 / 0.983, 32 bytes 1.005 / 0.986, unswizzled 0.918 / 0.967.
# FLASHTILE_GLUON_DQ_SWIZZLE (0, 32, 64 or 128) overrides it, for re-timing.
DQ_SUM_SWIZZLE = 128
DQ_SWIZZLE_SWITCH = "FLASHTILE_GLUON_DQ_SWIZZLE"

# How many of every 4 of Pᵀ's exponentials the five-product backward computes by a polynomial on
# the FMA units instead of the SFU (kernels/exp2_split.py), by kernel head dim: a consumer's SFU
# phase per step is ~512 clocks at d64 (64 × 128 exponentials a warpgroup at 16 a clock per SM),
# ~256 at d128. On the H200 (session 21, probes/exp_poly.py, kernels alone) 1 of 4 read +1-2% at
# d128 in one run of 3 rounds and -2% to +1% in the next of 5; d64 -3% to +2%: no gain beyond the
# runs' spread, so none under auto. FLASHTILE_GLUON_BWD_EXP_POLY (auto, 0, 1, 2) sets it for every head dim.
FUSED_EXP_POLY = {64: 0, 128: 0}
EXP_POLY_SWITCH = "FLASHTILE_GLUON_BWD_EXP_POLY"

# Whether the five-product backward's consumers load each step's lse2 row while the step's Sᵀ
# product runs, instead of after waiting for it (gluon_bwd._dkdv_tile's HOIST_STATS), by (kernel
# head dim, causal): session 21's ncu source view put most of the d128 kernel's short-scoreboard
# stalls (13% of the samples) on the FFMA and FADD waiting for the lse2 and Delta loads from
# shared memory. The row then holds 16 registers a thread across the wait at d128 (stack 8 -> 16
# bytes, Triton 3.6), 32 at d64 (48 -> 128 bytes non-causal, 72 causal); under Triton 3.9 the
# non-causal d128 build goes from 80 to 104 bytes (the causal one keeps none), not timed there.
# On the H200 (probes/hoist_stats.py, kernels alone, medians of 5 rounds, against without it):
#     d128, session 21: 1.027 / 1.024x at 4k (non-causal / causal), 1.023 / 1.034x at 16k;
#     d128, session 22: 1.028 / 1.019x at 1k, 1.021 / 1.010x at 4k, 1.015 / 1.020x at 16k;
#     d64, session 22:  0.983 / 1.019x at 1k, 0.983 / 1.028x at 4k, 0.968 / 1.003x at 16k.
# So on at d128, and at d64 for causal calls only (whose spill costs less than the wait it
# hides). FLASHTILE_GLUON_BWD_HOIST_STATS (auto, 0, 1) sets it for every call.
FUSED_HOIST_STATS = {(64, False): False, (64, True): True, (128, False): True, (128, True): True}
HOIST_STATS_SWITCH = "FLASHTILE_GLUON_BWD_HOIST_STATS"


# Whether the five-product backward's consumers leave each step's dK product in flight through
# their meeting at the dS buffer and the dQ product, waiting for it with dQ's (gluon_bwd_fused's
# DEFER_DK), instead of before the meeting: the two warpgroups meet every step, in step with each
# other, so the fence, the barrier and the wait for the other one ran with nothing of this
# warpgroup's on the tensor cores. With it every causal step runs, the few whose queries all precede
# a warpgroup's keys too (their Sᵀ all hidden). Attempt 66, session 26 (probes/defer_dk.py, kernels
# alone, CUDA graphs, medians of 3 rounds, over without it, non-causal / causal): d64 1.027 / 1.017
# at 4k, 1.017 / 1.013 at 16k; d128 0.986 / 1.017 at 4k, 0.975 / 1.014 at 16k. So on at d64 and
# for causal d128, by (kernel head dim, causal). FLASHTILE_GLUON_BWD_DEFER_DK (auto, 0, 1) sets it
# for every call.
FUSED_DEFER_DK = {(64, False): True, (64, True): True, (128, False): False, (128, True): True}
DEFER_DK_SWITCH = "FLASHTILE_GLUON_BWD_DEFER_DK"


# Whether the five-product backward runs persistent programs (gluon_bwd_fused's PERSISTENT: one a
# SM, each taking key tile after key tile), by (kernel head dim, causal): the most query rows a key
# tile may stream for them (the GQA group's heads × Sq: the steps a key tile takes, over which its
# fixed cost is spread; no entry: never). A program per key tile pays a fixed cost each:
# the CTA's start, its K and V and first Q-side tiles loaded with nothing running beside them, its dK
# and dV stored the same way. Session 21 fitted it at 1.2 steps of 128 queries at d64 and 1.9 of 64
# at d128 (probes/fused_program_cost.py): 13% of a d64 1k key tile's 8 steps, where persistent
# programs load the next tile's K, V and first Q-side tiles during this one's last steps and
# epilogue. Attempt 76, session 31 (H200, probes/fused_persistent.py, kernels alone in CUDA graphs,
# medians of 3 rounds, TFLOP/s persistent in fixed turns / a program per key tile / the
# seven-product kernels): d64 1k 389 / 370 / 341, causal 271 / 264 / 243; d64 2k 423 / 426 / 373,
# causal 336 / 337 / 317; d128 1k 438 / 427 / 428, causal 286 / 314 / 316; d128 2k 491 / 493 / 458,
# causal 289 / 409 / 400 (MHA: the rows a key tile streams are Sq): so at 1k rows, but for causal
# d128, whose programs in fixed turns drift apart over the causal tiles' unequal lengths. The
# dynamic scheduler (FUSED_DYNAMIC, attempt 79) fixes that (session 32, kernels alone: over a
# program per key tile at causal d128 1k / 2k / 4k / 8k / 16k 1.048 / 1.06-1.08 / 1.047 / 1.031 /
# 1.019; session 33 through the API, see FUSED_DYNAMIC), so causal d128 is persistent at any length
# (None). FLASHTILE_GLUON_BWD_PERSISTENT (auto, 0, 1) sets it for every call;
# FUSED_PERSISTENT_PROGRAMS caps the programs (None: the SMs; the tests take a few, so that each runs
# many key tiles).
FUSED_PERSISTENT_MAX_ROWS = {(64, False): 1024, (64, True): 1024, (128, False): 1024, (128, True): None}
FUSED_PERSISTENT_SWITCH = "FLASHTILE_GLUON_BWD_PERSISTENT"
FUSED_PERSISTENT_PROGRAMS: int | None = None
# Whether a persistent five-product program whose dK and dV are staged apart from K (d64) skips the
# two warpgroups' meeting after each key tile's last dQ product (gluon_bwd_fused's SKIP_END_MEETING:
# kv_empty guards K there). Attempt 78: under Triton 3.6 the d64 build's step loops spill 4 and 6
# local loads without the meeting where they spill 20 (and 13 stores) and 5 with it (a program per
# key tile: 1 and 8). Session 32 (probes/fused_persistent.py, medians of 3 rounds) put it at 0.984 /
# 1.000 the meeting's speed at d64 1k (non-causal / causal) and 0.974 / 0.995 at 2k: the spill was
# not what held the steps. Off. FLASHTILE_GLUON_BWD_SKIP_END_MEETING (auto, 0, 1).
FUSED_SKIP_END_MEETING = False
SKIP_END_MEETING_SWITCH = "FLASHTILE_GLUON_BWD_SKIP_END_MEETING"
# Whether persistent five-product programs take their key tiles from a counter the grid shares (a
# dynamic scheduler, as the forward's PERSISTENT_DYNAMIC) instead of in fixed turns, by causal.
# Attempt 79, written after session 31's device time: its fixed turns lost 9% at causal d128 1k and
# 29% at 2k against a program per key tile, where the forward's fixed turns had lost before its
# dynamic scheduler (attempt 63). Session 32 (probes/fused_persistent.py, kernels alone in CUDA
# graphs, medians of 3 rounds), over fixed turns at 1k / 2k: causal d128 1.142 / 1.530, causal d64
# 1.014 / 1.005; non-causal 0.978 / 0.981 at d64, 0.990 / 0.980 at d128. But through the API
# (autograd's backward, as flashtile bench times it; probes/api_backward_profile.py, causal 1k) each
# call took 234 µs more host time on it than in fixed turns at d128 (861 against 627) and 159 at d64
# (724 against 565), where the kernels' own times were 402 and 475 µs at d128: the d128 cell read
# 0.889 ms against 0.598 in fixed turns and 0.552 a program per key tile. That was one sample, the
# counter first, on a lease whose 1k cells drifted between calls. Session 33 ran the probe again in 3
# rounds, the settings' order rotated, on this tree (the counter an int32 of its own) and on 620bcbc's
# (the counter an extra row of the zeroed dQ sum): host µs a call dynamic / turns / tile / seven at
# d128 829 / 926 / 933 / 765 here and 780 / 676 / 841 / 751 there, at d64 740 / 653 / 800 / 705 and
# 672 / 725 / 735 / 585, the process's CPU time 89-100% of each; the dynamic d128 call was the
# fastest through do_bench in both (0.859 and 0.753 ms; a program per key tile 1.042 and 0.889). So
# no host cost of the counter's: the host of that lease was slow throughout (autograd's own floor, a
# Function returning ready gradients, 95-161 µs a call). Through flashtile bench (3 rounds, two
# passes) the causal d128 backward then read 428 / 483 / 542 TFLOP/s at 2k / 4k / 16k on it, against
# 408 / 469 / 527 a program per key tile (cuDNN 387-392 / 438-452 / 517-518). On for causal calls.
# FLASHTILE_GLUON_BWD_DYNAMIC (auto, 0, 1).
FUSED_DYNAMIC = {False: False, True: True}
FUSED_DYNAMIC_SWITCH = "FLASHTILE_GLUON_BWD_DYNAMIC"


def _table_setting(switch: str, table: dict, head_dim: int, causal: bool) -> bool:
    """Under ``switch`` auto, ``table``'s entry for (kernel ``head_dim``, ``causal``) (False where it
    has none); else the switch's 1 or 0."""
    return switched(switch, table.get((head_dim, causal), False))


def fused_defer_dk(head_dim: int, causal: bool) -> bool:
    """FUSED_DEFER_DK's entry for (``head_dim``, ``causal``), or FLASHTILE_GLUON_BWD_DEFER_DK where
    not auto."""
    return _table_setting(DEFER_DK_SWITCH, FUSED_DEFER_DK, head_dim, causal)


def fused_hoist_stats(head_dim: int, causal: bool) -> bool:
    """FUSED_HOIST_STATS's entry for (``head_dim``, ``causal``), or FLASHTILE_GLUON_BWD_HOIST_STATS
    where not auto."""
    return _table_setting(HOIST_STATS_SWITCH, FUSED_HOIST_STATS, head_dim, causal)


def fused_persistent(head_dim: int, causal: bool, rows: int) -> bool:
    """Under auto, whether FUSED_PERSISTENT_MAX_ROWS has an entry for (``head_dim``, ``causal``) that
    the ``rows`` a key tile streams (query heads of a kv head × Sq) do not pass; else
    FLASHTILE_GLUON_BWD_PERSISTENT's 1 or 0 (a tail split, FLASHTILE_GLUON_BWD_TAIL, still runs a
    program per key tile or part: _fused_backward). An entry of None: at any length."""
    limit = FUSED_PERSISTENT_MAX_ROWS.get((head_dim, causal), 0)  # (no entry: no key tile streams 0 rows)
    return switched(FUSED_PERSISTENT_SWITCH, limit is None or rows <= limit)


def fused_skip_end_meeting() -> bool:
    """FUSED_SKIP_END_MEETING, or FLASHTILE_GLUON_BWD_SKIP_END_MEETING where not auto (read only for
    persistent launches; the kernel applies it where dK and dV are staged apart from K)."""
    return switched(SKIP_END_MEETING_SWITCH, FUSED_SKIP_END_MEETING)


def fused_dynamic(causal: bool) -> bool:
    """FUSED_DYNAMIC's entry for ``causal``, or FLASHTILE_GLUON_BWD_DYNAMIC where not auto (read only
    for persistent launches)."""
    return switched(FUSED_DYNAMIC_SWITCH, FUSED_DYNAMIC[causal])


def fused_exp_poly(head_dim: int) -> int:
    """FUSED_EXP_POLY's entry for ``head_dim``, or FLASHTILE_GLUON_BWD_EXP_POLY where not auto."""
    value = choice(EXP_POLY_SWITCH, ("0", "1", "2"), "of every 4 exponentials")
    return FUSED_EXP_POLY.get(head_dim, 0) if value == "auto" else int(value)


def dq_sum_swizzle() -> int:
    """DQ_SUM_SWIZZLE, or FLASHTILE_GLUON_DQ_SWIZZLE where set (``auto`` or empty: the former)."""
    value = choice(DQ_SWIZZLE_SWITCH, ("0", "32", "64", "128"), "bytes")
    return DQ_SUM_SWIZZLE if value == "auto" else int(value)


@functools.lru_cache(maxsize=None)
def _sum_layout(box: tuple, swizzle: int):
    """The shared-memory layout of the five-product backward's float32 dQ boxes of ``box``
    (rows, columns) (its staging buffer's and the TMA reduction's), with ``swizzle`` bytes
    (dq_sum_swizzle), which a box row must be at least as wide as."""
    if swizzle > box[1] * 4:
        raise ValueError(f"a {swizzle}-byte swizzle for float32 rows of {box[1] * 4} bytes: at most the row's width")
    gl = _gluon()[1]
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=2)


@functools.lru_cache(maxsize=None)
def _stats_layout():
    """The unswizzled shared-memory layout of the backward's (1, rows) LSE and D boxes."""
    gl = _gluon()[1]
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


# Checked descriptors without their tensor, by (shape, strides, dtype, box, layout): a training
# step builds up to 15 descriptors (forward 4, backward 11), and Triton's constructor checks each
# one (4.5 µs on a fast CPU: a fifth of the Python of a stubbed forward + backward); a copy of
# a checked one with the new tensor put in takes about 1 µs. The one check that depends on the
# tensor rather than the key, a 16-byte aligned start, every caller has made (tma.layout_addressable
# in eligible(); the buffers the calls allocate are aligned).
_DESCRIPTOR_TEMPLATES: dict = {}
_TEMPLATES_MAX = 512


def _descriptor(t: torch.Tensor, box: tuple, layout):
    """A TMA descriptor of ``t`` (any rank up to 5) whose copies move ``box``-shaped tiles."""
    template = _template(t, box, layout)
    if template is None:  # (were Triton's descriptors ever a __slots__ class: each one built)
        return _gluon()[2](t, list(t.shape), list(t.stride()), list(box), layout)
    return _bound(template, t)


def _template(t: torch.Tensor, box: tuple, layout):
    """The checked descriptor of t's shape, strides and dtype moving ``box``-shaped tiles, without
    a tensor (made from ``t`` the first time: Triton's constructor checks it), or None where
    Triton's descriptors cannot be copied (a __slots__ class)."""
    key = (t.shape, t.stride(), t.dtype, box, layout)
    template = _DESCRIPTOR_TEMPLATES.get(key)
    if template is not None:
        return template
    descriptor = _gluon()[2](t, list(t.shape), list(t.stride()), list(box), layout)
    if not hasattr(descriptor, "__dict__"):
        return None
    if len(_DESCRIPTOR_TEMPLATES) >= _TEMPLATES_MAX:
        _DESCRIPTOR_TEMPLATES.clear()
    template = object.__new__(type(descriptor))
    template.__dict__.update(descriptor.__dict__)
    template.base = None  # the cache keeps no tensor alive
    # What fast_launch keys this descriptor's launches by (besides its base's alignment): an
    # object of its own per template, which the copies carry.
    setattr(template, fast_launch.LAUNCH_KEY, object())
    _DESCRIPTOR_TEMPLATES[key] = template
    return template


def _bound(template, t: torch.Tensor):
    """A copy of a descriptor template (``t``'s shape, strides and dtype) that addresses ``t``.
    Its shape, strides and block lists are the template's own: Triton's launcher only reads
    them (make_tensordesc_arg, 3.6 to 3.9), and nothing in flashtile writes them."""
    descriptor = object.__new__(type(template))
    descriptor.__dict__.update(template.__dict__)
    descriptor.base = t
    return descriptor


def _tile_box(t: torch.Tensor, rows: int, width: int | None) -> tuple:
    """(box, layout) of a (B, H, S, D) view's descriptors moving (1, 1, rows, width) tiles."""
    width = t.shape[3] if width is None else width
    return (1, 1, rows, width), _tile_layout(rows, width, t.dtype)


def _tile_descriptor(t: torch.Tensor, rows: int, width: int | None = None):
    """A TMA descriptor of a (B, H, S, D) view whose copies move (1, 1, rows, width) tiles;
    ``width`` (default D) may exceed D: the columns past it load as zeros and are not stored."""
    return _descriptor(t, *_tile_box(t, rows, width))


def _tile_template(t: torch.Tensor, rows: int, width: int):
    """The template of _tile_descriptor(t, rows, width), for callers that keep it and bind their
    tensors to it with _bound (None where descriptors are not copied)."""
    return _template(t, *_tile_box(t, rows, width))


# The block-sparse kernels (gluon_fwd._fwd_listed_kernel; gluon_bwd._dkdv_listed_kernel and
# _dq_listed_kernel) under FLASHTILE_GLUON / FLASHTILE_GLUON_BWD = auto, by backward (False:
# the forward); =1 takes them wherever they fit.
LISTED_UNDER_AUTO = {False: True, True: True}
# The block-sparse backward's tiles: dK/dV 64 query rows past 128 keys in 2 stages (the dense
# d128 kernel's), dQ 128 query rows past 64 keys in 3 stages (the dense d64 kernel's; at d128,
# 160 KiB of shared memory).
LISTED_BACKWARD_KEYS = 64
LISTED_DKDV_STAGES, LISTED_DQ_STAGES = 2, 3


def listed_tiles_fit(block_mask, head_dim: int) -> bool:
    """Whether the block-sparse Gluon forward runs ``block_mask``'s tiles: its Q tiles are the
    kernel's 128 rows, its K/V tiles 64 or 128 keys (64 at head dims past 128, where two
    stages of 128 keys would need 256 KiB of shared memory)."""
    widths = (64, 128) if kernel_head_dim(head_dim) <= 128 else (64,)
    return block_mask.block_m == BLOCK_M and block_mask.block_n in widths


def default_block_mask_tiles(q: torch.Tensor, seqlen_k: int, mask=None) -> tuple[int, int]:
    """The tiles (block_m, block_n) of the block mask that attention() builds for a mask_mod
    given without one: 128 × 128 where the block-sparse Gluon forward would take the call as
    eligible() decides for a plain one (the dense Gluon forward's tiles at d128), else the
    Triton kernels' 128 × 64 (wider tiles do not fit their shared memory at every head dim and
    dtype, and were not timed there). q: (B, S, H, D) or (B, H, S, D); ``mask``: the MaskMod the
    block mask is for (where its block-sparse forward failed to build here, 128 × 64)."""
    if not _device_runs_them(q) or q.dtype not in DTYPES or (kernel_head_dim(q.shape[-1]) or 512) > 128:
        return BLOCK_M, 64
    choice = setting()  # read here: a typo in it matters only where Gluon could run
    if choice == "auto":
        wide = LISTED_UNDER_AUTO[False] and _auto_takes(q, seqlen_k, False, False, mask, block_sparse=True)
    else:
        wide = choice == "1"
    return (BLOCK_M, 128) if wide else (BLOCK_M, 64)


# A sliding-window band (causal=True with a left window, or any window_size) runs as a block
# mask of the band on the block-sparse Gluon kernels where they cover both passes (api.py
# builds it once per band and shape): the Triton kernels' band path ran ~0.8x of the Gluon
# kernels' speed per tile. False: such calls keep the Triton kernels' band path.
BAND_AS_BLOCK_MASK = True


def band_takes_block_sparse(q: torch.Tensor, head_dim: int) -> bool:
    """Whether a plain sliding-window call on q (B, S, H, D) of ``head_dim`` runs as a block
    mask on the block-sparse Gluon kernels (BAND_AS_BLOCK_MASK): on sm_90 with the Gluon
    forward and backward both allowed, bf16 or fp16, at head dims whose Gluon backward was
    measured ahead (measured_faster) on the kernels of width 64 and 128: 40, 64, 96 and 128
    (d256's backward has no block-sparse Gluon kernel; other head dims were not timed)."""
    return (BAND_AS_BLOCK_MASK and q.dtype in DTYPES and kernel_head_dim(head_dim) in (64, 128)
            and measured_faster(head_dim, 0, backward=True)
            and _device_runs_them(q) and setting(False) != "0" and setting(True) != "0")


def listed_backward_fits(block_mask, head_dim: int) -> bool:
    """Whether the block-sparse Gluon backward runs ``block_mask``'s backward tiles: the dK/dV
    kernel's 64-row Q tiles past 128 keys (BlockMask.dkdv_blocks) and the dQ kernel's 128-row Q
    tiles past 64 keys (backward_blocks), at head dims up to 128 (d256's dK/dV is the wide
    kernel, not written for lists)."""
    return (kernel_head_dim(head_dim) <= 128 and block_mask.block_m == BLOCK_M
            and block_mask.backward_block_n == LISTED_BACKWARD_KEYS)


def _listed_stages(head_dim: int, block_n: int, seqlen_k: int) -> int:
    """Pipeline depth of the block-sparse forward: the dense forward's at its own tiles; with
    64-key tiles at d <= 128 (the block masks' default tiles), 3 stages, as many as the dense
    d128 kernel's from 4k keys (untimed at these tiles)."""
    dense_n, dense_stages = _config(head_dim, seqlen_k)
    return dense_stages if block_n == dense_n else 3


# A causal grid runs its B·H rows in groups whose streamed tensors (K and V for the forward and
# dQ, Q and dO for dK/dV) take about this much of the H200's 50 MB of L2, each group's heaviest
# tiles first (gluon_common.tile_and_row_of_program). Measured against rows one after the other
# (0 here; probes/causal_order.py, session 16, CUDA graphs): 16 MiB took 2-7% off the causal
# forward and backward from 2k to 8k keys (d256's forward the most), 8 MiB less at d256, 32
# MiB less at d128, and the whole grid as one group lost 2-14% (K/V fell out of L2).
CAUSAL_L2_BYTES = 16 * 2 ** 20


def causal_heads_per_group(causal: bool, rows: int, seqlen: int, head_dim: int, element_size: int,
                           shared_by: int = 1, streams_for: int = 1) -> int:
    """How many of a grid's ``rows`` (B·H of the program's own heads) go in one group of
    tile_and_row_of_program: 1 without a causal mask, where every tile carries the same work
    and rows one after the other keep a head's K/V in L2. Each row's programs stream two
    (seqlen, head_dim) tensors of ``element_size`` bytes, for ``streams_for`` heads of them
    (a dK/dV program reads the Q and dO of its kv head's GQA group), and ``shared_by`` rows
    share them (the forward's q heads of one kv head)."""
    if not causal or CAUSAL_L2_BYTES <= 0:
        return 1
    per_row = 2 * seqlen * head_dim * element_size * streams_for
    groups = max(1, min(rows, int(CAUSAL_L2_BYTES * shared_by // per_row)))
    # Triton compiles an int argument apart when it is 1 or a multiple of 16: one fewer than a
    # multiple of 16 keeps causal grids to two binaries (groups of one head, and the rest).
    return groups - 1 if groups % 16 == 0 else groups


# The dense forward's consumer warpgroups (gluon_fwd._fwd_pingpong_kernel's CONSUMERS), 64 query
# rows each, and the registers of a consumer thread: two (240 registers), or at kernel head dim
# 64 three, as FlashAttention-3's d64 forward runs (192-row tiles: more matmul work in flight per
# K/V tile, where d64's products are short). The CTA is then padded to 16 warps, and 128 threads ·
# (default partition + 2 · CONSUMER_REGS + 24) registers must fit the 64K file: at 160 a thread
# the default partition (the first consumer) gets 168; at 168 it would get 152.
# FLASHTILE_GLUON_FWD_CONSUMERS: auto (three at kernel head dim 64, two elsewhere), 2, or 3 (kernel
# head dim 64 only; others keep two). Three on 128-key tiles in turn ran 1.03 / 1.06 / 1.11x two
# non-causal at 1k / 4k / 16k keys and 0.96 / 1.05 / 1.07x causal (H200, session 24,
# probes/fwd_consumers.py, CUDA graphs); the causal 1k cell runs the Triton forward under auto
# (measured_faster), so auto takes three wherever it runs the d64 Gluon forward.
# FLASHTILE_GLUON_FWD_CONSUMERS=4 (kernel head dim 64): four consumers of 64 rows, 256-row tiles,
# which divide the grid's lengths (1k, 4k, 16k) where 192 rows leave a Q tile of one live part in
# six at 1k. Five warpgroups share the register file (the CTA padded to 20 warps): 112 a worker
# consumer, the default partition 120, so S, P and O take 64-key tiles (FORWARD_FOUR_CONSUMER_TILES).
FORWARD_CONSUMERS_SWITCH = "FLASHTILE_GLUON_FWD_CONSUMERS"
FORWARD_CONSUMER_REGS = {2: 240, 3: 160, 4: 112}
# The three consumers' (BLOCK_N, NUM_STAGES): FlashAttention-3's 128-key tiles, in 2 stages (88 KiB
# of shared memory). In FlashAttention-3's order (S of the next tile issued before this tile's P V)
# the consumer's S, P and O (64 + 32 + 32 registers a thread) spill at 160 registers (sm_90
# compile, Triton 3.6 and 3.9: 200-370 bytes of stack; 120-128 at 168) and ran 0.56-0.61x two
# consumers on the H200 (session 20), where 64-key tiles ran 0.92-0.98x in 3 stages and 0.91-0.96x
# in 2. So three consumers run each tile's products one after the other (FORWARD_OVERLAP): S is
# dead before O's product, and 128-key tiles compile without a spill (stack 0 at 160 registers,
# Triton 3.6 and 3.9; attempt 60). In 3 stages (120 KiB) they ran 0.98-1.02x 2 stages (session 24).
FORWARD_THREE_CONSUMER_TILES = (128, 2)
# The four consumers' (BLOCK_N, NUM_STAGES): 64-key tiles (S 32, P 16, O 32 and Q 16 registers a
# thread in turn; sm_90 compile at 112 registers: 0-16 bytes of stack under Triton 3.6, 32-48 in the
# set-up under 3.9).
FORWARD_FOUR_CONSUMER_TILES = (64, 3)
# Whether a consumer issues S of tile j+1 before O += P_j V_j (gluon_fwd._consumer's OVERLAP), by
# the count of consumers: two keep FlashAttention-3's order (every measurement since session 9);
# three do not (above). In the first order S_j and P_{j-1} V_{j-1} are in flight together, though
# ptxas waits for both before the exponentials (the kernel's docstring); in turn, a warpgroup's
# two product latencies add up, which the other warpgroups' products have to cover.
FORWARD_OVERLAP = {2: True, 3: False, 4: False}


def forward_consumers(head_dim: int) -> int:
    """The consumer warpgroups of the dense Gluon forward at kernel head dim ``head_dim``
    (``FLASHTILE_GLUON_FWD_CONSUMERS``): at 64 three, or what the switch says (2 or 4); two elsewhere."""
    if head_dim != 64:
        return 2
    switch = choice(FORWARD_CONSUMERS_SWITCH, ("2", "3", "4"))
    return 3 if switch == "auto" else int(switch)


def _forward_consumer_tiles(consumers: int, head_dim: int, seqlen_k: int) -> tuple[int, int]:
    """(BLOCK_N, NUM_STAGES) of the dense forward on ``consumers`` consumer warpgroups."""
    if consumers == 2:
        return _config(head_dim, seqlen_k)
    return FORWARD_THREE_CONSUMER_TILES if consumers == 3 else FORWARD_FOUR_CONSUMER_TILES


# FLASHTILE_GLUON_FWD_PERSISTENT: the dense forward on persistent programs (gluon_fwd's PERSISTENT:
# one a SM, each taking Q tiles pid, pid + programs, ...: the CTA's start paid once per program and,
# where shared memory holds a second Q buffer, the next tile's Q and first K/V loading while this
# one's last tiles and output run); auto: where persistent_measured_faster says, 0 never, 1 always.
FORWARD_PERSISTENT_SWITCH = "FLASHTILE_GLUON_FWD_PERSISTENT"
# Persistent programs taking their Q tiles from a counter shared by the grid (gluon_fwd's TileCounter;
# FlashAttention-3's dynamic scheduler): the tiles running at once stay consecutive in the
# grid's order, as with a program per tile, where fixed turns let causal programs drift apart over
# more heads' K/V than L2 holds. Session 25 (probes/fwd_persistent.py, CUDA graphs, over a program
# per tile at 1k / 4k / 16k keys, causal): d64 1.16 / 1.06 / 1.00, d128 1.15 / 1.06 / 1.02, d256
# 1.03 / 1.09 / 1.03, where fixed turns read 1.17 / 0.92 / 0.96, 1.15 / 0.87 / 0.82, 0.89 / 0.66 /
# 0.64. Each launch zeroes a counter of its own: a launch more, which a short call's host pays
# (the 1k cells are host-bound on the H200's machine). So None (auto): the dynamic scheduler for
# causal rows past 1k keys; fixed turns elsewhere, which read the same as it at 1k causal (d64,
# d128) and at every non-causal length timed (within 0.01 at d64 and d128). True or False:
# always or never (the tests and the probe).
PERSISTENT_DYNAMIC: bool | None = None
# A persistent program with one Q buffer (d256; d128 in 3 stages) copies the next tile's first K/V tiles
# before it waits for this tile's output to leave that buffer (gluon_fwd's EARLY_KV), where without
# it nothing of the next tile is copied before then (attempt 64). Session 25, d256 (probes/fwd_persistent.py,
# two rounds, over a program per tile, the dynamic scheduler without / with it): non-causal 1.01 / 1.02,
# 0.97 / 1.01, 0.95 / 0.98 at 1k / 4k / 16k, causal 1.02 / 1.02 and 0.99 / 1.00 at 1k and 4k: within
# the runs' noise where auto runs persistent programs, so off.
PERSISTENT_EARLY_KV = False
# Persistent programs in fixed turns take items p, p + P, p + 2P, ... of a grid whose Q tiles run
# fastest (non-causal), so a count P that shares a factor with a head's Q tiles hands each program
# the same few tile ranks: at d64 1k (6 tiles of 192 rows a head, 132 SMs) programs 5, 11, ... take
# only the heads' last tiles, whose one live 64-row part of three idles two consumers, and the
# others only whole ones, on which the grid then ends (probes/fwd_timeline.py, session 29). The
# largest count up to the SMs that shares no factor with the tiles a head and takes no more turns
# (131 there: 24 items for some programs either way) gives every program each rank in turn.
# Attempt 74, session 30 (probes/fwd_spread.py, and attempt 75's probe, kernels alone in CUDA
# graphs, two runs, 3 and 7 rounds; causal rows, which it leaves alone, read 0.99-1.03): d64 non-causal
# 1.041 / 1.049 at 1k, 1.033 / 1.007 at 2k, 1.015 / 1.008 at 4k. On under auto.
# FLASHTILE_GLUON_FWD_SPREAD (auto, 0, 1).
PERSISTENT_SPREAD = True
SPREAD_SWITCH = "FLASHTILE_GLUON_FWD_SPREAD"
# Persistent programs' consumers reading each item's batch, head, first row and K/V tile count from
# shared-memory slots the loader fills beside the item's Q (gluon_fwd's EARLY_COORDS), where otherwise
# each consumer works them out at the item's start (q_tile_of_program: integer divisions by runtime
# values), between one item's output and the next one's first product: session 29's timeline put the
# step to the next item at ~610 clocks of each item's ~2100 past its tiles (d64 non-causal 1k: 8 tiles
# an item). The loader works them out for its copies anyway. Attempt 77, session 32
# (probes/fwd_early_coords.py, d64, kernels alone in CUDA graphs, medians of 7 rounds, over without
# it at 1k / 2k / 4k): causal 1.028 / 1.048 / 1.027, non-causal 0.984 / 1.002 / 0.964; the timeline
# at d64 non-causal 1k put the step to the next item (last P·V to the next first product) at 4458
# clocks with it against 4712, but the item to item at 23574 against 23301. By (kernel head dim,
# causal): on for causal d64, where it was timed; no entry: off.
# FLASHTILE_GLUON_FWD_EARLY_COORDS (auto, 0, 1).
PERSISTENT_EARLY_COORDS = {(64, True): True}
EARLY_COORDS_SWITCH = "FLASHTILE_GLUON_FWD_EARLY_COORDS"
# sm_90's shared memory a block may opt in to, and what a forward CTA takes besides its tiles (the
# mbarriers), for forward_q_buffers.
SHARED_MEMORY_BYTES = 227 * 1024
_FORWARD_SHARED_EXTRA = 1024


def forward_persistent(head_dim: int, seqlen_k: int, causal: bool) -> bool:
    """Whether the dense Gluon forward at kernel head dim ``head_dim`` runs persistent programs
    (``FLASHTILE_GLUON_FWD_PERSISTENT``; auto: persistent_measured_faster)."""
    switch = choice(FORWARD_PERSISTENT_SWITCH, ("0", "1"))
    return switch == "1" or (switch == "auto" and persistent_measured_faster(head_dim, seqlen_k, causal))


def persistent_measured_faster(head_dim: int, seqlen_k: int, causal: bool) -> bool:
    """Where persistent programs beat a program per Q tile on the H200 (probes/fwd_persistent.py,
    CUDA graphs, bf16, 16k tokens; persistent over per tile at 1k / 4k / 16k keys). Causal
    (session 25; at 1k in fixed turns, past it on the dynamic scheduler, as persistent_dynamic
    chooses): d64 1.17 / 1.06 / 1.00, d128 1.15 / 1.06 / 1.02, d256 0.89 / 1.09 / 1.03 (1.03 at
    1k on the dynamic scheduler, which costs a launch there). Non-causal, in fixed turns (sessions
    24 and 25): d64 1.15-1.16 / 1.02-1.04 / 0.99-1.01, d128 1.15-1.17 / 1.00-1.01 / 0.98-1.01,
    d256 1.01 / 1.00-1.03 / 0.98-1.01. Short rows gain: a Q tile of 8 K/V tiles pays the CTA's
    start, Q's load and the ring's filling on few tiles; long non-causal rows and non-causal d256
    (one Q buffer: no room for a second beside its ring) gain nothing measurable, and stay a
    program per tile. At 2k keys (session 25, flashtile bench, 3 rounds, forward TFLOP/s,
    non-causal / causal): d128 607 / 509 persistent against 566 / 481 a program per tile; d64 464 /
    367 on the Gluon forward, persistent, against the Triton forward's 371 / 303."""
    if causal:
        return head_dim in (64, 128) or seqlen_k > 1024
    return head_dim in (64, 128) and seqlen_k <= 4096


def spread_programs(programs: int, tiles_per_row: int, items: int) -> int:
    """The largest count of persistent programs up to ``programs`` that shares no factor with
    ``tiles_per_row`` (a head's Q tiles) and leaves no program more of the ``items`` than
    ``programs`` do, so that fixed turns hand each program every tile rank at no cost in turns;
    ``programs`` where there is none."""
    turns = -(-items // programs)
    for spread in range(programs, 0, -1):
        if -(-items // spread) > turns:
            break
        if math.gcd(spread, tiles_per_row) == 1:
            return spread
    return programs


def _spread() -> bool:
    """PERSISTENT_SPREAD, or FLASHTILE_GLUON_FWD_SPREAD where not auto."""
    return switched(SPREAD_SWITCH, PERSISTENT_SPREAD)


def _early_coords(head_dim: int, causal: bool) -> bool:
    """PERSISTENT_EARLY_COORDS's entry for (kernel ``head_dim``, ``causal``) (False where it has none),
    or FLASHTILE_GLUON_FWD_EARLY_COORDS where not auto."""
    return _table_setting(EARLY_COORDS_SWITCH, PERSISTENT_EARLY_COORDS, head_dim, causal)


def persistent_dynamic(causal: bool, seqlen_k: int) -> bool:
    """Whether persistent programs take their Q tiles from the dynamic scheduler (PERSISTENT_DYNAMIC;
    auto: causal rows past 1k keys) rather than in fixed turns."""
    if PERSISTENT_DYNAMIC is not None:
        return PERSISTENT_DYNAMIC
    return causal and seqlen_k > 1024


def forward_q_buffers(head_dim: int, block_m: int, block_n: int, num_stages: int, element_size: int = 2) -> int:
    """Q buffers of a persistent forward CTA: two (the next tile's Q and first K/V tiles load
    during this one) where they fit in shared memory beside the K/V ring, else one (e.g. d256: a
    64 KiB Q tile and a 128 KiB ring; d128 in 3 stages), where nothing of the next tile is copied
    before this one's output has been stored."""
    q_tile = block_m * head_dim * element_size
    ring = 2 * num_stages * block_n * head_dim * element_size
    return 2 if 2 * q_tile + ring + _FORWARD_SHARED_EXTRA <= SHARED_MEMORY_BYTES else 1


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, softmax_scale: float,
            causal: bool, block_mask=None) -> torch.Tensor:
    """Write out (B, Hq, Sq, D) and return the LSE (B, Hq, Sq), float32, natural log. D of any
    size up to 256 runs the kernel of kernel_head_dim(D). With ``block_mask`` (tiles that
    listed_tiles_fit; not causal) the block-sparse kernel visits its listed tiles only."""
    gluon_fwd = _gluon()[0]
    batch, heads_q, seqlen_q, _ = q.shape
    head_dim = kernel_head_dim(q.shape[3])
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
    if block_mask is not None:
        block_mask = _forward_block_mask(block_mask, head_dim)
        _listed_forward(gluon_fwd, q, k, v, out, lse, softmax_scale, block_mask, head_dim,
                        cdiv(seqlen_q, BLOCK_M))
        return lse
    consumers = forward_consumers(head_dim)
    persistent = forward_persistent(head_dim, k.shape[2], causal)
    plan = _dense_forward_plan(q, k, v, out, softmax_scale, causal, head_dim, consumers,
                               sm_count(q.device) if persistent else 0)
    tensors = (q, k, v, out)
    if plan.templates is not None:
        descriptors = [_bound(template, t) for template, t in zip(plan.templates, tensors)]
    else:  # (a Triton whose descriptors cannot be copied: each call builds its own)
        descriptors = [_tile_descriptor(t, rows, head_dim) for t, rows in zip(tensors, plan.rows)]
    # the dynamic scheduler's counter, zeroed for each launch (a memset node under CUDA-graph capture)
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if plan.dynamic else None
    fast_launch.launch(gluon_fwd._fwd_pingpong_kernel, plan.grid, *descriptors, lse, *plan.scalars, counter,
                       **plan.constexprs)
    return lse


class _DenseForwardPlan(NamedTuple):
    """What a dense forward launch is besides its tensors: the grid, the tile rows of the
    descriptors of q, k, v and out and their templates (None where Triton's descriptors are not
    copied), the arguments after the LSE and the constexprs."""

    grid: tuple
    rows: tuple
    templates: tuple | None
    scalars: tuple
    constexprs: dict
    dynamic: bool = False  # persistent programs on the dynamic scheduler (a counter per launch)


# Dense forward plans by what they are worked out from: the shapes, strides and dtype, the scale,
# causal, the consumers, and the module settings a probe or test swaps (the tiles, the three
# consumers' tiles and registers, the order of the products, the causal L2 budget and its rule,
# the persistent programs' settings and, where they apply, the spread and early-coordinates switches),
# so that a swap gets a new plan, not a stale one. A repeat finds its plan instead of working out
# the tiles, the grid and four descriptors' keys again: 13.9 -> 9.0 µs of this forward on a fast
# CPU (session 23).
_DENSE_FORWARD_PLANS: dict = {}
_PLANS_MAX = 256


def _dense_forward_plan(q, k, v, out, softmax_scale: float, causal: bool, head_dim: int,
                        consumers: int, persistent_programs: int = 0) -> _DenseForwardPlan:
    """The plan of forward()'s dense launch for these tensors (q/out (B, Hq, Sq, D), k/v (B, Hkv,
    Sk, D), one dtype), made on the first call of its kind. ``persistent_programs`` > 0: at most
    that many persistent programs (the SMs), 0: a program per Q tile."""
    overlap = FORWARD_OVERLAP.get(consumers, True)
    # Spreading the programs applies only where a head's last Q tile is part-filled, on persistent
    # programs, without a causal mask; its switch is read only there, so that other calls pay no
    # environment read for it.
    spread = bool(q.shape[2] % (BLOCK_M // 2 * consumers) and persistent_programs and not causal and _spread())
    # (the same for the consumers' coordinates from the loader: read on persistent programs only)
    early_coords = bool(persistent_programs) and _early_coords(head_dim, causal)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), out.stride(), q.dtype, softmax_scale, causal,
           consumers, _config, FORWARD_THREE_CONSUMER_TILES, FORWARD_FOUR_CONSUMER_TILES,
           FORWARD_CONSUMER_REGS.get(consumers), overlap,
           CAUSAL_L2_BYTES, causal_heads_per_group, persistent_programs, SHARED_MEMORY_BYTES,
           _FORWARD_SHARED_EXTRA, PERSISTENT_DYNAMIC, PERSISTENT_EARLY_KV, spread, early_coords)
    plan = _DENSE_FORWARD_PLANS.get(key)
    if plan is not None:
        return plan
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_n, num_stages = _forward_consumer_tiles(consumers, head_dim, seqlen_k)
    part_m = BLOCK_M // 2  # rows per consumer warpgroup
    block_m = part_m * consumers
    num_m_blocks = cdiv(seqlen_q, block_m)
    group = heads_q // heads_kv
    heads_per_group = causal_heads_per_group(causal, batch * heads_q, seqlen_k, head_dim, q.element_size(),
                                             shared_by=group)
    rows = (part_m, block_n, block_n, part_m)
    templates = tuple(_tile_template(t, r, head_dim) for t, r in zip((q, k, v, out), rows))
    # (CONSUMERS and OVERLAP passed only when they are not the kernel's defaults: the two-consumer
    # launch's arguments, and so its fast_launch key, stay as they were)
    extra = {} if consumers == 2 else {"CONSUMERS": consumers}
    if not overlap:
        extra["OVERLAP"] = False
    programs = num_m_blocks * batch * heads_q
    if persistent_programs:
        extra.update(PERSISTENT=True, Q_BUFFERS=forward_q_buffers(head_dim, block_m, block_n, num_stages,
                                                                  q.element_size()))
        if PERSISTENT_EARLY_KV and extra["Q_BUFFERS"] == 1:
            extra["EARLY_KV"] = True
        if early_coords:  # (passed only when on: the default launch's arguments stay as they were)
            extra["EARLY_COORDS"] = True
        # (only where some programs take more than one tile, the last tile of a head has idle parts
        # and the tiles go in fixed turns: see PERSISTENT_SPREAD)
        if spread and programs > persistent_programs and not persistent_dynamic(causal, seqlen_k):
            persistent_programs = spread_programs(persistent_programs, num_m_blocks, programs)
        programs = min(programs, persistent_programs)
    dynamic = bool(persistent_programs) and persistent_dynamic(causal, seqlen_k)
    plan = _DenseForwardPlan(
        grid=(programs,), rows=rows,
        templates=None if any(template is None for template in templates) else templates,
        # after the LSE: its strides (a new contiguous (B, Hq, Sq) tensor), then the problem
        scalars=(heads_q * seqlen_q, seqlen_q, heads_q, group, seqlen_q, seqlen_k, num_m_blocks, heads_per_group,
                 softmax_scale * LOG2E),
        constexprs=dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=num_stages, CAUSAL=causal,
                        LOADER_REGS=24, CONSUMER_REGS=FORWARD_CONSUMER_REGS[consumers], num_warps=4, **extra),
        dynamic=dynamic,
    )
    if len(_DENSE_FORWARD_PLANS) >= _PLANS_MAX:
        _DENSE_FORWARD_PLANS.clear()
    _DENSE_FORWARD_PLANS[key] = plan
    return plan


def _forward_block_mask(block_mask, head_dim: int):
    """The block mask whose forward lists the block-sparse forward walks. One whose key tiles were
    left to the library (create_block_mask's block_n=None, 64 keys) is walked over 128-key tiles
    of the same mask where the dense forward runs 128-key tiles (kernel head dims 64 and 128): at
    d128, N = 16k, a causal mask_mod's forward ran 1.06× the built-in causal on 128 × 128 tiles
    against 1.19× on 128 × 64 (session 15, masks.py). The wider lists are built on first use and
    kept; not while a CUDA graph is being captured (building them reads back to the host), when
    the 64-key lists run."""
    if (block_mask.forward_tiles_free and head_dim <= 128
            and not (block_mask.kv_indices.is_cuda and torch.cuda.is_current_stream_capturing())):
        return block_mask.with_forward_key_tiles(128)
    return block_mask


def _listed_forward(gluon_fwd, q, k, v, out, lse, softmax_scale, block_mask, head_dim, num_m_blocks) -> None:
    """Launch _fwd_listed_kernel over ``block_mask``'s forward lists (see forward)."""
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_n = block_mask.block_n
    (indices, partial, count, order, _), strides, _ = block_mask.lists("fwd")
    buffer = block_mask.mask_buffer
    fast_launch.launch(
        gluon_fwd._fwd_listed_kernel, (num_m_blocks * batch * heads_q,),
        _tile_descriptor(q, BLOCK_M // 2, head_dim), _tile_descriptor(k, block_n, head_dim),
        _tile_descriptor(v, block_n, head_dim), _tile_descriptor(out, BLOCK_M // 2, head_dim),
        lse, lse.stride(0), lse.stride(1), indices, partial, count, order, buffer, *strides,
        heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, num_m_blocks, softmax_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=block_n, NUM_STAGES=_listed_stages(head_dim, block_n, seqlen_k),
        MASK_MOD=block_mask.mask.triton_fn(), LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4,
    )


# The backward's tiles, (BLOCK_M, BLOCK_N, stages) of each kernel: dK/dV streams BLOCK_M query
# rows past BLOCK_N keys (half per consumer warpgroup at d64 and d128), dQ BLOCK_N-key tiles past BLOCK_M query
# rows. From session 10's sweep (benchmarks/probes/gluon_sweep.py; CUDA graphs of the kernels,
# bf16, 16k tokens, TFLOP/s full / causal at 1k, 4k, 16k): d128's dQ with 128-key tiles in 2
# stages, 424 / 478 / 477 and 324 / 443 / 472, against 404 / 472 / 474 and 316 / 393 / 470 with
# 64-key tiles (dK/dV stays at 2 stages: its registers reach R237 of 240, and 3 were up to 6%
# slower in session 9). d64's dK/dV with 128-row Q tiles, 337 / 403 / 412 and 248 / 360 / 402,
# against 300 / 347 / 362 and 237 / 329 / 366 with 64 rows.
# d256 runs gluon_bwd_wide's dK/dV kernel: 64 keys per CTA shared by both warpgroups, Pᵀ handed
# between them through WIDE_P_BUFFERS float32 slots (2: 225 KiB of shared memory in all); its dQ
# tiles have 32 keys (64 would need 256 KiB in 2 stages; 64 in 1 stage, 4-16% slower in session
# 11's sweep).
BWD_DKDV = {128: (64, 128, 2), 64: (128, 128, 2), 256: (64, 64, 2)}
BWD_DQ = {128: (128, 128, 2), 64: (128, 64, 3), 256: (128, 32, 2)}
WIDE_P_BUFFERS = 2
STATS_ROWS = 128  # LSE and D rows padded to a multiple of both kernels' BLOCK_M (dQ 128, dK/dV 64 or 128)
# Whether the seven-product dQ kernels work out those rows themselves (gluon_bwd.row_stats, before
# their first tile) instead of reading what a preprocess launch wrote: one launch fewer per
# backward, for host-bound steps (session 15's profile: the preprocess's launch 80-100 µs of a
# 16-document step's 1.0-1.3 ms). Under auto where dq_stats_measured_faster says.
DQ_STATS_SWITCH = "FLASHTILE_GLUON_DQ_STATS"
DQ_STATS_UNDER_AUTO = True
DQ_STATS_MAX_KEYS = 4096


def dq_stats_measured_faster(seqlen_k: int, block_sparse: bool) -> bool:
    """Where the dQ kernels' own row stats timed no slower than the preprocess launch on the H200
    (session 18, torch 2.11, triton 3.6, bf16, 16k tokens, probes/backward_ab.py, median of 3
    rounds; time with them over time without, CUDA-graph backward / eager forward + backward):
    d64 causal 1k 0.972 / 0.905, d128 1k causal 0.999 / 0.968, non-causal 0.999 / 1.008, d128
    causal 4k 0.994 / 0.972, d256 causal 1k 0.980 / 1.040; a causal mask of 16 documents at 16k
    0.989 / 0.952, of 4 documents 1.018 / 0.997. At 16k keys dense the kernels alone ran 0.6-1.4%
    slower (d64, d128 and d256 non-causal 1.014, 1.006, 1.008; d128 causal 1.008): the prologue
    runs before the first tile with nothing beside it, where the preprocess streamed O and dO at
    full bandwidth. So: dense calls up to DQ_STATS_MAX_KEYS keys, and block-sparse calls (whose
    rows visit the tiles their mask lets through: the host-bound steps this was made for)."""
    return block_sparse or seqlen_k <= DQ_STATS_MAX_KEYS

# The five-product backward (gluon_bwd_fused.py), (BLOCK_M, BLOCK_N, stages): d128 the tiles of
# the probe it came from (attempt 30; docs/performance.md); d64 128-row Q tiles, half the dQ
# reductions per key of 64-row ones: session 13's sweep (probes/fused_bwd.py --tiles, triton
# 3.9, CUDA graphs), non-causal 357-459 TFLOP/s at 1k-16k against 334-413 with 64 rows in 2
# stages and 327-412 in 3 (attempt 38). Its dQ sum is (B·Hq·S_pad, D) float32
# rows that TMA addresses with 32-bit coordinates.
BWD_FUSED = {128: (64, 128, 2), 64: (128, 128, 2)}
FUSED_SWITCH = "FLASHTILE_GLUON_BWD_FUSED"
_TMA_ROWS = 2 ** 31
# Whether auto takes the fused backward where fused_measured_faster says. Off in session 12, when
# a review found a race in its epilogue after the GPU time ran out (the faster warpgroup staged dK
# in K's buffer while the other's last dQ product could still read it) and added a barrier
# meeting; on since session 13 ran the kernel with that barrier on the H200 under Triton 3.9: its
# GPU tests (256 passed), the oracle check and timings of probes/fused_bwd.py, and a racecheck
# whose hazards are all in code Triton generates (benchmarks/results/2026-11-30-h200-session13).
FUSED_UNDER_AUTO = True
# Whether auto takes the five-product backward where Gluon lacks TMA reductions (Triton before
# 3.8, the GPU image's 3.6), its reduction a TMA store rewritten in the PTX (tma_reduce_ptx.py).
# On since session 19 ran it on the H200 under 3.6: its GPU tests (256 passed), the oracle check
# and timings of probes/fused_bwd.py (ahead of the seven-product kernels where
# fused_measured_faster says but d128 causal at 8k keys, 0.97x; 1.07x and 0.99x in session 20),
# a racecheck whose hazards are all in code Triton generates, as under 3.9
# (benchmarks/results/2026-12-01-h200-session19).
PTX_REDUCE_UNDER_AUTO = True
# Head dims at which a causal five-product backward's programs visit their Q tiles last first
# (gluon_common.q_tile_start: programs started together then walk the same Q, dO and dQ-sum
# tiles in step, as non-causal ones do, instead of a window as wide as the running grid).
# Attempt 51 (session 20, probes/fused_q_order.py, CUDA graphs, medians of 3 alternating
# rounds, triton 3.6): d128 causal 2k / 4k / 8k / 16k 1.028 / 1.028 / 1.022 / 1.012x the
# ascending order; d64 1.002 / 0.994 / 1.015 / 0.986x, within the rounds' spread, so not there.
FUSED_Q_DESCENDING = {128: True}
_FUSED_FAILED: set = set()  # (head dim, dtype, causal) whose fused kernel failed to build here


def fused_measured_faster(head_dim: int) -> bool:
    """Where the five-product backward beat the seven-product one on the H200 (session 12,
    triton 3.9, bf16, 16k tokens, CUDA graphs of the kernels, benchmarks/probes/fused_bwd.py;
    TFLOP/s at 1k / 2k / 4k / 8k / 16k): d128 non-causal 446 / 517 / 526 / 541 / 540 against
    406 / 459 / 470 / 465 / 472; causal 310 / 390 / 449 / 478 / 515 against 328 / 402 / 463 /
    451 / 489, so causal from 8k keys. Session 13 (the kernel with the epilogue's barrier):
    446 / 518 / 542 / 551 / 544 against 417 / 466 / 464 / 468 / 471, causal 310 / 392 / 454 /
    486 / 515 against 329 / 406 / 465 / 450 / 479. Through flashtile.attention the causal call
    was 1.00-1.33x the seven-product one at every length in both sessions (fewer kernels behind
    the host path), but the kernels alone decide here, for callers who capture CUDA graphs.
    d64 (session 13, 128-row Q tiles, BWD_FUSED): 357 / 408 / 440 / 448 / 459 against 349 / 391 /
    392 / 398 / 402, causal 241 / 313 / 370 / 405 / 435 against 251 / 315 / 355 / 378 / 388, so
    causal from 4k keys (with attempt 36's 64-row tiles: -6% to +4%, ahead by 1-4% only from 4k
    keys non-causal and at 16k causal). Session 20 (triton 3.6; attempts 51 and 52: the causal d128
    kernel's Q tiles last first, its groups' L2 budget counting the dQ sum): d128 causal at 2k /
    4k / 8k 401 / 476 / 503 against 399 / 446 / 509; 4k keys alone had read 1.01-1.02x without
    them (sessions 19, 20), so d128 causal from 4k keys now, as d64. Session 31 (triton 3.6,
    probes/fused_persistent.py, the kernel of sessions 22-26: HOIST_STATS, DEFER_DK): d64 causal
    at 1k / 2k 264 / 337 a program per key tile and 271 / 336 on persistent programs (the 1k
    call's choice, fused_persistent) against 243 / 317, so d64 causal at every length now; d128
    causal 314 / 409 against 316 / 400 stays from 4k keys. Session 32 (the same probe, a program per
    key tile against the seven-product kernels): d128 causal at 1k / 2k / 4k / 8k / 16k 315 / 412 /
    469 / 512 / 527 against 321 / 382 / 426 / 462 / 467 (a second run at 2k: 400 against 386), and
    through the API at 1k (probes/api_backward_profile.py) 0.552 ms against 0.555: so d128 causal
    from 2k keys. Session 33: on persistent programs from the dynamic scheduler (FUSED_DYNAMIC) the
    causal d128 1k kernels take 521 µs (400 the fused kernel, 121 the preprocess, the sum's zeros and
    its conversion) against the seven-product kernels' 534: so every length, at d64 and d128."""
    return head_dim in (64, 128)


def _takes_fused(q: torch.Tensor, head_dim: int, causal: bool, s_pad: int, deterministic: bool) -> bool:
    """Whether this backward runs gluon_bwd_fused.py (``FLASHTILE_GLUON_BWD_FUSED``: auto, 1, 0).
    Never when the call asks for a deterministic backward. With a Triton whose Gluon lacks TMA
    reductions (before 3.8) only where PTX_REDUCE_UNDER_AUTO, or under 1: the kernel's reduction
    is then a TMA store rewritten in the PTX (tma_reduce_ptx.py)."""
    choice = setting(name=FUSED_SWITCH)
    if choice == "0" or deterministic or torch.are_deterministic_algorithms_enabled():
        return False
    if head_dim not in BWD_FUSED or q.shape[0] * q.shape[1] * s_pad >= _TMA_ROWS:
        return False
    if choice == "auto" and not (_gluon_common().HAS_TMA_REDUCE or PTX_REDUCE_UNDER_AUTO):
        return False
    if choice == "auto":  # as timed: the call's own head dim (a padded one, e.g. 96 on 128, has not been)
        return (FUSED_UNDER_AUTO and fused_measured_faster(q.shape[3])
                and (head_dim, q.dtype, causal) not in _FUSED_FAILED)
    return True


def backward(q, k, v, out, dout, lse, dlse, softmax_scale: float, causal: bool, dq, dk, dv,
             deterministic: bool = False, block_mask=None) -> None:
    """Write dq (B, Hq, Sq, D) and dk, dv (B, Hkv, Sk, D). ``out``, ``dout``: (B, Hq, Sq, D), the
    forward's output and its gradient; ``lse``, ``dlse``: (B, Hq, Sq) float32 contiguous, the
    forward's natural-log LSE and its gradient (None: none). The kernels read LSE·log2(e) and
    Delta = rowsum(dO ∘ O) − dLSE from (B·Hq, S_pad) float32 rows, S_pad a multiple of
    STATS_ROWS, padding rows (and rows that saw no key) +inf and 0, so their P is exactly 0 and
    no tile needs a row mask: a preprocess launch writes them, or the seven-product dQ kernels,
    which run first, do (FLASHTILE_GLUON_DQ_STATS: _RowStats.for_dq_kernel). D of any size up to 256 runs the
    kernels of kernel_head_dim(D). ``deterministic``: the same bits on every call (the
    seven-product kernels; the five-product one adds dQ in no fixed order). With
    ``block_mask`` (listed_backward_fits; not causal) the block-sparse kernels visit its listed
    tiles only, every output with one writer."""
    head_dim = kernel_head_dim(q.shape[3])  # the kernels' width: D, or D's columns and zeros
    batch, heads_q, seqlen_q, _ = q.shape
    s_pad = cdiv(seqlen_q, STATS_ROWS) * STATS_ROWS
    lse2 = torch.empty(batch * heads_q, s_pad, dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse2)
    stats = _RowStats(out, dout, lse, dlse, lse2, delta)
    built = {}

    def tile(t, rows):
        """A view's descriptor, built once for both kernels where their tiles agree (at d128
        and d256 q and dO move 64-row tiles in both, at d64 k and v: 9 descriptors instead of 11)."""
        key = (id(t), rows)
        if key not in built:
            built[key] = _tile_descriptor(t, rows, head_dim)
        return built[key]

    if block_mask is not None:
        return _listed_backward(q, k, v, dout, stats, softmax_scale, dq, dk, dv, head_dim, tile, block_mask)
    if _takes_fused(q, head_dim, causal, s_pad, deterministic):
        try:
            return _fused_backward(q, k, v, dout, stats, softmax_scale, causal, dq, dk, dv, head_dim, tile)
        except Exception as error:  # a kernel that cannot be built here: the seven-product one instead
            if not _fused_falls_back(error, head_dim, q.dtype, causal):
                raise
    _seven_product_backward(q, k, v, dout, stats, softmax_scale, causal, dq, dk, dv, head_dim, tile)


class _RowStats:
    """The backward's per-row statistics: where the dQ kernels compute them from (the forward's
    output and LSE, their gradients) and the padded (B·Hq, S_pad) rows they go to, lse2 and delta."""

    __slots__ = ("out", "dout", "lse", "dlse", "lse2", "delta")

    def __init__(self, out, dout, lse, dlse, lse2, delta):
        self.out, self.dout, self.lse, self.dlse, self.lse2, self.delta = out, dout, lse, dlse, lse2, delta

    def for_dq_kernel(self, seqlen_k: int, block_sparse: bool) -> tuple[tuple, dict]:
        """The dQ kernels' arguments from LSE2 to head_dim and their ROW_STATS and HAS_DLSE. With
        FLASHTILE_GLUON_DQ_STATS on (auto: DQ_STATS_UNDER_AUTO where dq_stats_measured_faster for
        the call's ``seqlen_k`` and ``block_sparse``) the kernel works the rows out
        (gluon_bwd.row_stats reads Out to head_dim); otherwise the preprocess writes them now,
        and Out to head_dim are Nones: each a constexpr None to Triton, so that kernel has the
        parameters and the binary it had before there was a choice, and its launch keys no more
        arguments."""
        choice = setting(name=DQ_STATS_SWITCH)
        lse2 = self.lse2
        under_auto = DQ_STATS_UNDER_AUTO and dq_stats_measured_faster(seqlen_k, block_sparse)
        if not (choice == "1" or (choice == "auto" and under_auto)):
            self.preprocess()
            return (lse2, self.delta, lse2.stride(0), *_NO_ROW_STATS), _PREPROCESSED
        out, dout, lse, dlse = self.out, self.dout, self.lse, self.dlse
        args = (lse2, self.delta, lse2.stride(0), out, dout, lse, dlse if dlse is not None else lse,
                *out.stride()[:3], *dout.stride()[:3], lse.stride(0), lse.stride(1), out.shape[3])
        return args, dict(ROW_STATS=True, HAS_DLSE=dlse is not None)

    def preprocess(self, dq_sum: torch.Tensor | None = None, counter: torch.Tensor | None = None) -> None:
        """Fill lse2 and delta with one launch of bwd._bwd_preprocess, for kernels that read them
        as they are; the same launch zeroes ``dq_sum`` (the five-product backward's float32 (B·Hq·S_pad,
        width) rows) and ``counter`` (its dynamic scheduler's int32) where given."""
        out, lse = self.out, self.lse
        batch, heads_q, seqlen_q, _ = out.shape
        s_pad = self.lse2.shape[1]
        num_m_pre = s_pad // bwd.PREPROCESS_ROWS
        fast_launch.launch(
            bwd._bwd_preprocess, (num_m_pre * batch * heads_q,),
            out, self.dout, self.dlse if self.dlse is not None else lse, self.delta, lse, lse, self.lse2,
            dq_sum, counter,
            *out.stride(), *self.dout.stride(), lse.stride(0), lse.stride(1), s_pad, heads_q, seqlen_q, num_m_pre,
            HEAD_DIM=out.shape[3], HEAD_DIM_PADDED=padded_head_dim(out.shape[3]),
            BLOCK_M=bwd.PREPROCESS_ROWS, HAS_DLSE=self.dlse is not None, IS_VARLEN=False, PADDED=True,
            DQ_SUM_WIDTH=0 if dq_sum is None else dq_sum.shape[1],
        )


# The dQ kernels' parameters that row_stats reads (gluon_bwd._dq_kernel's, Out to head_dim), in
# order: a launch without ROW_STATS passes None for each (tools/compile_check.py compiles it so).
ROW_STATS_PARAMS = ("Out", "DO", "LSE", "DLSE", "stride_ob", "stride_oh", "stride_om", "stride_dob", "stride_doh",
                    "stride_dom", "stride_lb", "stride_lh", "head_dim")
_NO_ROW_STATS = (None,) * len(ROW_STATS_PARAMS)
_PREPROCESSED = dict(ROW_STATS=False, HAS_DLSE=False)  # (dLSE is the preprocess's to subtract)


def _stats(buffer, rows):
    """A descriptor of an lse2 or Delta buffer (B·Hq, S_pad) whose copies move (1, rows) boxes."""
    return _descriptor(buffer, (1, rows), _stats_layout())


# The five-product backward's tail split (gluon_bwd_fused._dkdv_dq_kernel's TAIL_SPLIT): a
# non-causal grid of P equal programs on S SMs ends in a part-empty wave when S does not divide
# P (every d128 cell of the speed grid: 2048 programs, 15.52 waves on 132 SMs, the last wave half
# empty); its last programs' key tiles run as several parts of their Q tiles each, their dK and
# dV summed from float32 partials. FLASHTILE_GLUON_BWD_TAIL: auto (off), 1 (where tail_split
# finds a gain), 0. Off under auto: on the H200 (session 21, probes/fused_tail.py, kernels alone)
# the split ran 0.971-0.980x the whole grid at d128 (8k, 16k) and 0.926-0.942x at d64. Why is
# not settled; one reading: the last, part-empty wave runs faster a step than a full one (fewer
# SMs share L2 and the power budget), so counting waves overstates what a split saves, and the
# parts add their partials' traffic and a fixed cost each.
TAIL_SWITCH = "FLASHTILE_GLUON_BWD_TAIL"
TAIL_UNDER_AUTO = False
TAIL_MIN_GAIN = 0.01  # the least fraction of the grid's waves a split must save
TAIL_MAX_SPLITS = 8
TAIL_MIN_STEPS = 32  # a part must keep at least this many steps: each has a fixed cost (K/V, the epilogue)


def tail_split(programs: int, sms: int, steps: int) -> tuple[int, int] | None:
    """(whole programs, splits): the grid's first programs run whole, the rest (the part-empty
    last wave, and with it one or two full waves where that ends sooner) as ``splits`` parts
    each, the split that ends the grid soonest in waves of whole programs (ties: fewer parts);
    None where nothing saves TAIL_MIN_GAIN of the waves. ``steps``: a whole program's steps
    (no part may run fewer than TAIL_MIN_STEPS). E.g. 2048 programs on 132 SMs: 16 waves as they
    are; the last 68 in 7 parts, 15.57."""
    if programs <= sms or programs % sms == 0:
        return None
    as_is = cdiv(programs, sms)
    best = None
    for folded in range(3):  # full waves run as parts besides the last, part-empty one
        tail = programs % sms + folded * sms
        if tail >= programs:
            break
        for splits in range(2, TAIL_MAX_SPLITS + 1):
            if steps // splits < TAIL_MIN_STEPS:
                break
            waves = (programs - tail) / sms + cdiv(tail * splits, sms) / splits
            if best is None or waves < best[0] - 1e-9:
                best = (waves, programs - tail, splits)
    if best is None or best[0] > as_is * (1 - TAIL_MIN_GAIN):
        return None
    return best[1], best[2]


def _takes_tail_split(q: torch.Tensor, causal: bool, programs: int, steps: int) -> tuple[int, int] | None:
    """The tail split of a fused backward's grid (tail_split), where FLASHTILE_GLUON_BWD_TAIL
    allows: non-causal only (a causal grid's programs are of unequal length and run heaviest
    first, which already leaves no empty wave)."""
    value = setting(name=TAIL_SWITCH)
    if causal or value == "0" or (value == "auto" and not TAIL_UNDER_AUTO):
        return None
    return tail_split(programs, sm_count(q.device), steps)


def _fused_backward(q, k, v, dout, stats, softmax_scale, causal, dq, dk, dv, head_dim, tile) -> None:
    """The preprocess, gluon_bwd_fused.py's kernel (dK, dV and a float32 dQ sum), then its
    conversion into dq."""
    gluon_bwd_fused = _fused_module()
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    lse2, delta = stats.lse2, stats.delta
    s_pad = lse2.shape[1]
    block_m, block_n, stages = BWD_FUSED[head_dim]
    num_n_blocks = cdiv(seqlen_k, block_n)
    group = heads_q // heads_kv
    programs = num_n_blocks * batch * heads_kv
    split = _takes_tail_split(q, causal, programs, group * cdiv(seqlen_q, block_m))
    persistent = split is None and fused_persistent(head_dim, causal, group * seqlen_q)
    dynamic = persistent and fused_dynamic(causal)
    # The dQ sum and (persistent programs on the dynamic scheduler) its counter, both zeroed by the
    # preprocess below: two fills' launches fewer on the host path, which bounds the short calls.
    dq_acc = torch.empty(batch * heads_q * s_pad, head_dim, dtype=torch.float32, device=q.device)
    counter = torch.empty(1, dtype=torch.int32, device=q.device) if dynamic else None
    box = (block_m, head_dim // 2)
    dq_acc_desc = _descriptor(dq_acc, box, _sum_layout(box, dq_sum_swizzle()))
    # Each program streams its group's Q and dO (2-byte inputs) and adds into the dQ sum's rows
    # of those heads, as many bytes again in float32: both count against the group's L2 budget
    # (session 20, attempt 52: at d128 causal 16k one head a group was 2.6% faster than two).
    heads_per_group = causal_heads_per_group(causal, batch * heads_kv, seqlen_q, head_dim, q.element_size(),
                                             streams_for=2 * group)
    stats.preprocess(dq_acc, counter)
    by_ptx = not _gluon_common().HAS_TMA_REDUCE
    check = None
    if by_ptx:  # the reduction is a TMA store, rewritten as the kernel builds
        tma_reduce_ptx.install()
        check = tma_reduce_ptx.check
    tail = (0, 1, None, None)  # (n_whole, splits, DkPart, DvPart): no split
    # (PERSISTENT passed only when on: the launch of a program per key tile keeps its arguments
    # and fast_launch key)
    extra = {}
    if persistent:
        extra["PERSISTENT"] = True
        if fused_skip_end_meeting():
            extra["SKIP_END_MEETING"] = True
        programs = min(programs, FUSED_PERSISTENT_PROGRAMS or sm_count(q.device))
    if split is not None:
        n_whole, splits = split
        parts = (programs - n_whole) * splits
        dk_part, dv_part = (torch.empty(parts * block_n, head_dim, dtype=torch.float32, device=q.device)
                            for _ in range(2))
        tail = (n_whole, splits, dk_part, dv_part)
        programs = n_whole + parts
    fast_launch.launch(
        gluon_bwd_fused._dkdv_dq_kernel, (programs,),
        tile(q, block_m), tile(dout, block_m), tile(k, block_n // 2), tile(v, block_n // 2), tile(dk, block_n // 2),
        tile(dv, block_n // 2), _stats(lse2, block_m), _stats(delta, block_m), dq_acc_desc,
        heads_q, heads_kv, group, seqlen_q, seqlen_k, num_n_blocks, heads_per_group, s_pad,
        softmax_scale * LOG2E, softmax_scale, *tail, counter,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal,
        LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4, REDUCE_BY_PTX=by_ptx,
        Q_DESCENDING=causal and FUSED_Q_DESCENDING.get(head_dim, False), TAIL_SPLIT=split is not None,
        EXP_POLY=fused_exp_poly(head_dim), HOIST_STATS=fused_hoist_stats(head_dim, causal),
        DEFER_DK=fused_defer_dk(head_dim, causal), check=check, **extra,
    )
    if split is not None:
        rows = 64
        fast_launch.launch(
            gluon_bwd_fused._dkdv_parts_convert, (parts // splits, block_n // rows),
            dk_part, dv_part, dk, dv, *dk.stride()[:3], *dv.stride()[:3], n_whole, splits, num_n_blocks, heads_kv,
            seqlen_k, dk.shape[3], BLOCK_N=block_n, HEAD_DIM=head_dim, ROWS=rows,
        )
    rows = 64
    fast_launch.launch(
        gluon_bwd_fused._dq_convert, (batch * heads_q, cdiv(seqlen_q, rows)),
        dq_acc, dq, dq.stride(0), dq.stride(1), dq.stride(2), heads_q, seqlen_q, dq.shape[3], s_pad, softmax_scale,
        HEAD_DIM=head_dim, BLOCK=rows,
    )


class FusedBackwardError(RuntimeError):
    """The five-product backward, forced on (FLASHTILE_GLUON_BWD_FUSED=1), could not be built.
    A RuntimeError of its own type, so that falls_back never reads it as a build error to
    recover from."""


def _is_build_error(error: BaseException) -> bool:
    """Whether ``error`` says a kernel could not be built here (BUILD_ERRORS, or MLIR's pass failure)."""
    return isinstance(error, BUILD_ERRORS) or (type(error) is RuntimeError and _PASS_FAILURE in str(error))


def _error_line(error: BaseException, limit: int = 200) -> str:
    """``error``'s type and the first line of its message, for a warning or a wrapping error."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:limit]}"


def _fused_falls_back(error: BaseException, head_dim: int, dtype: torch.dtype, causal: bool) -> bool:
    """Whether a fused launch that raised ``error`` should run the seven-product kernels: under
    auto, when the kernel could not be built (as falls_back, for this kernel alone; one warning).
    Under 1 such an error becomes a FusedBackwardError, which falls_back does not take for a
    build error of the whole Gluon backward (under FLASHTILE_GLUON_BWD=auto it would otherwise
    send the call to Triton and mark the seven-product kernels broken for this shape)."""
    if not _is_build_error(error):
        return False
    choice = setting(name=FUSED_SWITCH)
    if choice == "1":
        raise FusedBackwardError(f"{FUSED_SWITCH}=1: the five-product backward (head dim {head_dim}) failed to "
                                 f"build with triton {triton.__version__}: {_error_line(error, 300)}") from error
    if choice != "auto":
        return False
    key = (head_dim, dtype, causal)
    if key not in _FUSED_FAILED:
        _FUSED_FAILED.add(key)
        warnings.warn(f"flashtile: the five-product Gluon backward (head dim {head_dim}, {str(dtype)[6:]}, "
                      f"causal={causal}) failed to build with triton {triton.__version__} ({_error_line(error)}); "
                      f"these calls run the seven-product kernels from now on. {FUSED_SWITCH}=0 skips it, "
                      f"{FUSED_SWITCH}=1 makes this an error.", RuntimeWarning, stacklevel=5)
    return True


def _listed_backward(q, k, v, dout, stats, softmax_scale, dq, dk, dv, head_dim, tile, block_mask) -> None:
    """gluon_bwd's dQ kernel (which may write the rows' stats: _RowStats.for_dq_kernel) and dK/dV
    kernel over ``block_mask``'s backward lists (see backward)."""
    gluon_bwd = _gluon()[3]
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    qk_scale = softmax_scale * LOG2E
    mask = block_mask.mask
    buffer = block_mask.mask_buffer
    rows, keys = block_mask.backward_blocks
    (indices, partial, count, order, _), strides, _ = block_mask.lists("dq")
    num_m_blocks = cdiv(seqlen_q, rows)
    stats_args, stats_constexprs = stats.for_dq_kernel(seqlen_k, block_sparse=True)
    fast_launch.launch(
        gluon_bwd._dq_listed_kernel, (num_m_blocks * batch * heads_q,),
        tile(q, rows // 2), tile(dout, rows // 2), tile(k, keys), tile(v, keys), tile(dq, rows // 2), *stats_args,
        indices, partial, count, order, buffer, *strides, heads_q, heads_q // heads_kv, seqlen_q, seqlen_k,
        num_m_blocks, qk_scale, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_M=rows, BLOCK_N=keys, NUM_STAGES=LISTED_DQ_STAGES, MASK_MOD=mask.triton_fn(),
        **stats_constexprs, LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4,
    )
    rows, keys = block_mask.dkdv_blocks
    (indices, partial, count, order, _), strides, _ = block_mask.lists("dkdv")
    num_n_blocks = cdiv(seqlen_k, keys)
    fast_launch.launch(
        gluon_bwd._dkdv_listed_kernel, (num_n_blocks * batch * heads_kv,),
        tile(q, rows), tile(dout, rows), tile(k, keys // 2), tile(v, keys // 2), tile(dk, keys // 2),
        tile(dv, keys // 2), _stats(stats.lse2, rows), _stats(stats.delta, rows), indices, partial, count, order,
        buffer, *strides,
        heads_q, heads_kv, heads_q // heads_kv, seqlen_q, seqlen_k, num_n_blocks, qk_scale, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_M=rows, BLOCK_N=keys, NUM_STAGES=LISTED_DKDV_STAGES, MASK_MOD=mask.triton_fn(),
        LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4,
    )


def _seven_product_backward(q, k, v, dout, stats, softmax_scale, causal, dq, dk, dv, head_dim, tile) -> None:
    """gluon_bwd.py's dQ kernel (which may write the rows' stats: _RowStats.for_dq_kernel), then its
    dK/dV kernel (gluon_bwd_wide.py's at d256)."""
    gluon_bwd, gluon_bwd_wide = _gluon()[3:]
    batch, heads_q, seqlen_q, _ = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    qk_scale = softmax_scale * LOG2E
    group = heads_q // heads_kv
    block_m, block_n, stages = BWD_DQ[head_dim]
    num_m_blocks = cdiv(seqlen_q, block_m)
    stats_args, stats_constexprs = stats.for_dq_kernel(seqlen_k, block_sparse=False)
    fast_launch.launch(
        gluon_bwd._dq_kernel, (num_m_blocks * batch * heads_q,),
        tile(q, block_m // 2), tile(dout, block_m // 2), tile(k, block_n), tile(v, block_n), tile(dq, block_m // 2),
        *stats_args, heads_q, group, seqlen_q, seqlen_k, num_m_blocks,
        causal_heads_per_group(causal, batch * heads_q, seqlen_k, head_dim, q.element_size(), shared_by=group),
        qk_scale, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal, **stats_constexprs,
        LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4,
    )
    block_m, block_n, stages = BWD_DKDV[head_dim]
    num_n_blocks = cdiv(seqlen_k, block_n)
    if head_dim > 128:  # a CTA's keys shared by both warpgroups, one gradient each
        dkdv_kernel, kv_rows, wide = gluon_bwd_wide._dkdv_wide_kernel, block_n, dict(P_BUFFERS=WIDE_P_BUFFERS)
    else:  # each warpgroup its half of the CTA's keys, both gradients
        dkdv_kernel, kv_rows, wide = gluon_bwd._dkdv_kernel, block_n // 2, {}
    fast_launch.launch(
        dkdv_kernel, (num_n_blocks * batch * heads_kv,),
        tile(q, block_m), tile(dout, block_m), tile(k, kv_rows), tile(v, kv_rows), tile(dk, kv_rows),
        tile(dv, kv_rows), _stats(stats.lse2, block_m), _stats(stats.delta, block_m),
        heads_q, heads_kv, group, seqlen_q, seqlen_k, num_n_blocks,
        causal_heads_per_group(causal, batch * heads_kv, seqlen_q, head_dim, q.element_size(), streams_for=group),
        qk_scale, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, CAUSAL=causal,
        LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4, **wide,
    )
