"""Host side of the Gluon Hopper backward (gluon_bwd.py): preprocessing, descriptors, launches.

    dq, dk, dv = backward(q, k, v, out, dout, lse, softmax_scale, causal)

q, out, dout: (B, Hq, Sq, D) views, k, v: (B, Hkv, Sk, D) views (any strides TMA can address:
last stride 1, others 16-byte aligned), bf16 or fp16, D in {64, 128}; lse: (B, Hq, Sq) float32,
natural log (as flashtile's forward and torch's flash SDPA return it). Causal is bottom-right
aligned. Self-contained: the preprocessing is a small Triton kernel here.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

# The kernels are the library's (src/flashtile/kernels/gluon_bwd.py); this probe brings its own
# preprocessing and config knobs so that each kernel can be timed alone.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "src"))
from flashtile.kernels import gluon_bwd  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

LOG2E = 1.4426950408889634
PAD = 128  # rows of the lse2 / Delta buffers are padded to this (the dQ kernel's BLOCK_M)


@triton.jit
def _bwd_prep_kernel(Out, DO, LSE, LSE2, Delta,
                     stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_lb, stride_lh,
                     heads_q, seqlen_q, s_pad, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """lse2 = LSE * log2(e) (+inf where LSE = -inf and on padding rows) and Delta =
    rowsum(dO * O) (0 on padding rows), into (B*Hq, s_pad) float32 buffers."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    batch = bh // heads_q
    head = bh % heads_q
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    inside = rows < seqlen_q
    o = tl.load(Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
                + rows[:, None].to(tl.int64) * stride_om + cols[None, :], mask=inside[:, None], other=0.0)
    do = tl.load(DO + batch.to(tl.int64) * stride_dob + head.to(tl.int64) * stride_doh
                 + rows[:, None].to(tl.int64) * stride_dom + cols[None, :], mask=inside[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    lse = tl.load(LSE + batch.to(tl.int64) * stride_lb + head.to(tl.int64) * stride_lh + rows, mask=inside,
                  other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    base = bh.to(tl.int64) * s_pad
    tl.store(LSE2 + base + rows, lse2)
    tl.store(Delta + base + rows, delta)


def _config(head_dim: int):
    """((BLOCK_M, BLOCK_N, stages) of dK/dV, (BLOCK_M, BLOCK_N, stages) of dQ). Compile-checked
    only: d128 dK/dV at 3 stages spills 4 B (outside the loop) under triton 3.6."""
    stages = int(os.environ.get("GLUON_BWD_DKDV_STAGES", 2 if head_dim == 128 else 3))
    dq_block_n = int(os.environ.get("GLUON_BWD_DQ_BLOCK_N", 64))
    dq_stages = int(os.environ.get("GLUON_BWD_DQ_STAGES", 3 if dq_block_n == 64 else 2))
    return (64, 128, stages), (128, dq_block_n, dq_stages)


def supported(q, k, v, out, dout) -> bool:
    ok = q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0)
    ok = ok and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in (64, 128)
    return ok and all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0
                                                                              for s in t.stride()[:-1])
                      for t in (q, k, v, out, dout))


def _descriptor(t, rows):
    box = [1, 1, rows, t.shape[-1]]
    element = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    return TensorDescriptor(t, list(t.shape), list(t.stride()), box, gl.NVMMASharedLayout.get_default_for(box, element))


def _stats_descriptor(buf, block_m):
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return TensorDescriptor(buf, list(buf.shape), list(buf.stride()), [1, block_m], layout)


def preprocess(out, dout, lse, heads_q, seqlen_q):
    batch = out.shape[0]
    s_pad = triton.cdiv(seqlen_q, PAD) * PAD
    lse2 = torch.empty(batch * heads_q, s_pad, dtype=torch.float32, device=out.device)
    delta = torch.empty_like(lse2)
    block = 64
    _bwd_prep_kernel[(s_pad // block, batch * heads_q)](
        out, dout, lse, lse2, delta, out.stride(0), out.stride(1), out.stride(2), dout.stride(0), dout.stride(1),
        dout.stride(2), lse.stride(0), lse.stride(1), heads_q, seqlen_q, s_pad, HEAD_DIM=out.shape[-1], BLOCK=block,
        num_warps=4)
    return lse2, delta


def backward(q, k, v, out, dout, lse, softmax_scale: float, causal: bool, dq=None, dk=None, dv=None,
             which=("dkdv", "dq")):
    """dq (B, Hq, Sq, D), dk, dv (B, Hkv, Sk, D) in q's dtype. ``which`` launches only some
    kernels (the timing of one kernel); the outputs of the others are left unwritten."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    assert heads_q % heads_kv == 0 and dout.stride(-1) == 1
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    (bm_kv, bn_kv, st_kv), (bm_q, bn_q, st_q) = _config(head_dim)
    lse2, delta = preprocess(out, dout, lse, heads_q, seqlen_q)
    qk_scale = softmax_scale * LOG2E
    group = heads_q // heads_kv

    if "dkdv" in which:
        num_n_blocks = triton.cdiv(seqlen_k, bn_kv)
        gluon_bwd._dkdv_kernel[(num_n_blocks * batch * heads_kv, )](
            _descriptor(q, bm_kv), _descriptor(dout, bm_kv), _descriptor(k, bn_kv // 2), _descriptor(v, bn_kv // 2),
            _descriptor(dk, bn_kv // 2), _descriptor(dv, bn_kv // 2), _stats_descriptor(lse2, bm_kv),
            _stats_descriptor(delta, bm_kv),
            heads_q, heads_kv, group, seqlen_q, seqlen_k, num_n_blocks, qk_scale, softmax_scale,
            HEAD_DIM=head_dim, BLOCK_M=bm_kv, BLOCK_N=bn_kv, NUM_STAGES=st_kv, CAUSAL=causal,
            LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4)
    if "dq" in which:
        num_m_blocks = triton.cdiv(seqlen_q, bm_q)
        gluon_bwd._dq_kernel[(num_m_blocks * batch * heads_q, )](
            _descriptor(q, bm_q // 2), _descriptor(dout, bm_q // 2), _descriptor(k, bn_q), _descriptor(v, bn_q),
            _descriptor(dq, bm_q // 2), lse2, delta, lse2.stride(0),
            heads_q, group, seqlen_q, seqlen_k, num_m_blocks, qk_scale, softmax_scale,
            HEAD_DIM=head_dim, BLOCK_M=bm_q, BLOCK_N=bn_q, NUM_STAGES=st_q, CAUSAL=causal,
            LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4)
    return dq, dk, dv
