"""What the Gluon kernels (gluon_fwd.py, gluon_bwd.py) share: TMA copy names across Triton
versions, and the register layout of a wgmma accumulator."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

# Triton 3.7 renamed the TMA copies (3.6: async_copy_global_to_shared / _shared_to_global);
# the old names still exist in 3.9 but fail when compiled.
if hasattr(tma, "async_load"):
    tma_load = tma.async_load
    tma_store = tma.async_store
else:
    tma_load = tma.async_copy_global_to_shared
    tma_store = tma.async_copy_shared_to_global


@gluon.constexpr_function
def accumulator_layout(num_warps, columns):
    """wgmma's register layout of an (M, columns) float32 accumulator: 16-bit inputs take
    instructions of 16 rows x columns x 16; the warps stack along M."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, columns, 16])
