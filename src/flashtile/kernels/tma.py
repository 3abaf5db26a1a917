"""Tensor descriptors for the tiles the attention kernels stream (Hopper's TMA), opt-in.

With a descriptor, one instruction copies a whole K or V tile into shared memory and fills
zeros past the tensor's edges. The pointer path computes an address and a bounds mask per
element instead. The forward and the dQ kernel stream K and V, the dK/dV kernel Q and dO.
The descriptor path is taken with ``FLASHTILE_TMA=1``, on sm_90 and newer (or under the
interpreter, for the tests), for dense batches whose tensors TMA can address.
Packed (varlen) batches keep the pointer path: a descriptor's zero fill stops at the end of
the packed tensor, not at the end of each sequence.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..backends import compute_capability, interpreting

# Triton 3.6's ptxas crashes (SIGSEGV) on the forward and dQ kernels' descriptor loops at
# num_stages=2 (every head dim, causal or not; the dK/dV kernel compiled); 1 and 3 stages
# compile, and Triton 3.9 compiles all three (tools/compile_check.py). Configs at 2 stages
# keep the pointer path, in every kernel.
_CRASHING_STAGES = {2} if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9) else set()


def requested() -> bool:
    """Whether the user asked for descriptors (``FLASHTILE_TMA=1``)."""
    return os.environ.get("FLASHTILE_TMA", "0") == "1"


def compiles(num_stages: int) -> bool:
    """Whether this Triton builds the descriptor path at this pipeline depth."""
    return interpreting() or num_stages not in _CRASHING_STAGES


def layout_addressable(t: torch.Tensor) -> bool:
    """Whether TMA can address t's memory (B, H, S, D), whatever the device: unit last
    stride, the others multiples of 16 bytes and nonzero where their dimension has more than
    one index (an expanded view's zero strides are not known to be accepted), and a 16-byte
    aligned start."""
    # (The Hopper path asks this of up to eight tensors per backward call: the shape part is
    # remembered per shape, strides and element size, 2.1 -> 0.6 µs a tensor on a fast CPU.)
    return t.data_ptr() % 16 == 0 and _strides_addressable(t.shape, t.stride(), t.element_size())


@functools.lru_cache(maxsize=1024)
def _strides_addressable(shape: tuple, strides: tuple, elem: int) -> bool:
    if strides[-1] != 1 or any(s * elem % 16 for s in strides[:-1]):
        return False
    return not any(stride == 0 and size > 1 for size, stride in zip(shape, strides))


def addressable(t: torch.Tensor) -> bool:
    """Whether TMA can read t (B, H, S, D): its layout (``layout_addressable``) on a GPU of
    compute capability 9.0 or newer, or in the interpreter."""
    if not layout_addressable(t):
        return False
    if interpreting():
        return True
    return t.is_cuda and torch.version.hip is None and compute_capability(t.device)[0] >= 9


def wanted(varlen, *tensors: torch.Tensor) -> bool:
    """Whether a call's launches should stream ``tensors`` through descriptors: asked for,
    a dense batch (``varlen`` None), and every one of them addressable."""
    return varlen is None and requested() and all(addressable(t) for t in tensors)


def launch_tiles(use: bool, tensors, rows: int, head_dim_padded: int, num_stages: int) -> tuple[bool, tuple]:
    """(whether this launch takes the descriptor path, what it passes for ``tensors``):
    their descriptors when ``use`` and this Triton builds the path at ``num_stages``, else
    the tensors themselves (the pointer path)."""
    if use and compiles(num_stages):
        return True, tile_descriptors(tensors, rows, head_dim_padded)
    return False, tuple(tensors)


def tile_descriptors(tensors, rows: int, head_dim_padded: int) -> tuple:
    """A descriptor of each (B, H, S, D) tensor whose tile is (1, 1, rows, head_dim_padded)."""
    box = [1, 1, rows, head_dim_padded]
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), box) for t in tensors)
