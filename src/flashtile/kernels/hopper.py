"""When and how the forward takes the Gluon kernel of gluon_fwd.py (Hopper, sm_90).

Opt-in with ``FLASHTILE_GLUON=1`` until its GPU tests have run on this version. The
kernel covers plain attention, causal or not, with GQA, at head dims 64, 128 and 256 in
bf16/fp16, on tensors TMA can address; every other call runs the Triton forward.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from ..backends import interpreting
from ..masks import Band
from . import tma

LOG2E = 1.4426950408889634
BLOCK_M = 128  # two consumer warpgroups of 64 rows


def requested() -> bool:
    """Whether the user asked for the Gluon forward (``FLASHTILE_GLUON=1``)."""
    return os.environ.get("FLASHTILE_GLUON", "0") == "1"


@functools.lru_cache(maxsize=None)
def _gluon():
    """The kernel module and Gluon's language and descriptor classes, or None where this
    Triton's Gluon is older than the kernel: 3.5 has every name imported here, but its
    ``warp_specialize`` takes other arguments, so 3.6 is the first the kernel builds with."""
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        return None
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from . import gluon_fwd
    except (ImportError, AttributeError):  # absent, or an older Gluon without these names
        return None
    return gluon_fwd, gl, TensorDescriptor


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, band: Band, *, softcap: float,
             alibi_slopes, bias, dropout_p: float, varlen, block_mask, score_mod) -> bool:
    """Whether this forward call can run on the Gluon kernel. q/out: (B, Hq, Sq, D), k/v:
    (B, Hkv, Sk, D), views of any strides."""
    if not requested() or interpreting() or not q.is_cuda:
        return False
    if torch.cuda.get_device_capability(q.device) != (9, 0):  # wgmma and setmaxnreg as on sm_90
        return False
    plain = (softcap == 0 and alibi_slopes is None and bias is None and dropout_p == 0 and varlen is None
             and block_mask is None and score_mod is None and band.left is None and band.right in (None, 0))
    if not plain or q.dtype not in (torch.bfloat16, torch.float16) or q.shape[3] not in (64, 128, 256):
        return False
    if q.numel() == 0 or k.numel() == 0:  # the public API rejects these; a direct op call may not
        return False
    return all(tma.addressable(t) for t in (q, k, v, out)) and _gluon() is not None


def _config(head_dim: int, seqlen_k: int) -> tuple[int, int]:
    """(BLOCK_N, NUM_STAGES). d128: measured on the H200 (docs/performance.md, attempt 26):
    2 stages ahead at N = 1k (539 against 521 TFLOP/s), 3 at 4k (586 against 566), even at
    16k. d64: 3 stages of 128-key tiles (115 KiB of shared memory); d256: 2 stages of 64-key
    tiles (197 KiB); neither timed yet."""
    if head_dim == 128:
        return 128, (3 if seqlen_k >= 4096 else 2)
    if head_dim == 256:
        return 64, 2
    return 128, 3


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, softmax_scale: float,
            causal: bool) -> torch.Tensor:
    """Write out (B, Hq, Sq, D) and return the LSE (B, Hq, Sq), float32, natural log."""
    gluon_fwd, gl, TensorDescriptor = _gluon()
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    block_n, num_stages = _config(head_dim, seqlen_k)
    element = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16

    def descriptor(t, rows):
        box = [1, 1, rows, head_dim]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), box,
                                gl.NVMMASharedLayout.get_default_for(box, element))

    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
    num_m_blocks = triton.cdiv(seqlen_q, BLOCK_M)
    gluon_fwd._fwd_pingpong_kernel[(num_m_blocks * batch * heads_q,)](
        descriptor(q, BLOCK_M // 2), descriptor(k, block_n), descriptor(v, block_n), descriptor(out, BLOCK_M // 2),
        lse, lse.stride(0), lse.stride(1), heads_q, heads_q // heads_kv, seqlen_q, seqlen_k, num_m_blocks,
        softmax_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=block_n, NUM_STAGES=num_stages, CAUSAL=causal,
        LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4,
    )
    return lse
