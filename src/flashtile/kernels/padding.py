"""The rows of a packed (variable-length) batch that belong to no sequence.

flash-attn's packed tensors may hold rows before ``cu_seqlens[0]`` and from
``cu_seqlens[-1]`` on. The attention kernels never visit them, yet their outputs and
gradients must read as "no sequence" (zeros, an LSE of -inf), never as uninitialised
memory. Filling the whole tensor first writes every row; this kernel writes only those
rows, reading the two offsets on the device (no host sync). Most batches have none.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fast_launch
from .common import cdiv, next_power_of_2
from .configs import interpreting

_PROGRAMS = 128  # enough to write a long tail quickly; with no padding each exits at once


@triton.jit
def _fill_rows_outside_kernel(
    X, Cu, num_seqs, total_rows, num_cols, stride_row, stride_col, value,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    first = tl.load(Cu)  # rows [0, first) and [last, total_rows) are padding
    last = tl.load(Cu + num_seqs)
    num_pad = first + (total_rows - last)
    offs_c = tl.arange(0, BLOCK_C)
    fill = tl.full([BLOCK_R, BLOCK_C], value, X.dtype.element_ty)
    for r0 in range(tl.program_id(0) * BLOCK_R, num_pad, tl.num_programs(0) * BLOCK_R):
        pad = r0 + tl.arange(0, BLOCK_R)  # the pad-th padding row: before `first`, then from `last`
        row = tl.where(pad < first, pad, pad - first + last).to(tl.int64)
        for c0 in range(0, num_cols, BLOCK_C):
            cols = c0 + offs_c
            tl.store(X + row[:, None] * stride_row + cols[None, :].to(tl.int64) * stride_col, fill,
                     mask=(pad < num_pad)[:, None] & (cols < num_cols)[None, :])


def fill_rows_outside(x: torch.Tensor, cu_seqlens: torch.Tensor, value: float) -> None:
    """Write ``value`` into the rows of x (total, cols), any strides, outside every sequence.

    cu_seqlens: (num_seqs + 1,) int32 offsets into the rows, on x's device, contiguous.
    """
    total, cols = x.shape
    if total == 0 or cols == 0:
        return
    block_c = min(512, next_power_of_2(cols))
    block_r = max(1, 4096 // block_c)
    programs = 1 if interpreting() else min(_PROGRAMS, cdiv(total, block_r))
    fast_launch.launch(
        _fill_rows_outside_kernel, (programs,),
        x, cu_seqlens, cu_seqlens.shape[0] - 1, total, cols, x.stride(0), x.stride(1), float(value),
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=1 if interpreting() else 4,
    )
