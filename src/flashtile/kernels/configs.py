"""Launch configurations: tile sizes, warps and pipeline stages per problem and GPU.

A config is chosen from (padded head dim, dtype, causal, GPU generation), then its
pipeline depth is trimmed until the shared-memory estimate fits the device's limit
(read from the device, never assumed). Under Triton's interpreter there is exactly
one small config: it runs on the CPU, where only correctness matters.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from ..backends import interpreting


@dataclass(frozen=True)
class KernelConfig:
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


INTERPRETER_CONFIG = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)

# Set by :func:`override` (tuning scripts, experiments); None means "use the table".
_override: dict = {"forward": None, "backward": None}


@contextlib.contextmanager
def override(forward: KernelConfig | None = None, backward: tuple[KernelConfig, KernelConfig] | None = None):
    """Force the configs inside a ``with`` block (tuning sweeps); ``backward`` is (dkdv, dq)."""
    saved = dict(_override)
    _override.update(forward=forward, backward=backward)
    try:
        yield
    finally:
        _override.update(saved)


@functools.lru_cache(maxsize=None)
def device_limits(device_index: int) -> tuple[tuple[int, int], int]:
    """(compute capability, max shared memory per block in bytes) of a CUDA device."""
    props = torch.cuda.get_device_properties(device_index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 101376
    return (props.major, props.minor), smem


def _smem_bytes(cfg: KernelConfig, head_dim: int, elem: int, streams_keys: bool, resident_tiles: int,
                bias_elem: int, dropout: bool = False) -> int:
    # Each pipeline stage buffers the two streamed tiles (K and V in the forward and dQ
    # kernels, Q and dO in the dK/dV kernel) and, with a bias, its BLOCK_M × BLOCK_N tile
    # in the bias's own dtype; the resident tiles are staged once. The dK/dV kernel also
    # stages the LSE and Delta (float32) of its streamed rows. Dropout adds one byte per
    # score: Triton moves the keep mask between layouts through shared memory (measured by
    # compiling for sm_90: 16 KiB at 128 × 128; tests/test_configs.py checks the estimate).
    streamed_rows, resident_rows = (cfg.BLOCK_N, cfg.BLOCK_M) if streams_keys else (cfg.BLOCK_M, cfg.BLOCK_N)
    tiles = (cfg.num_stages * 2 * streamed_rows + resident_tiles * resident_rows) * head_dim * elem
    row_stats = 0 if streams_keys else cfg.num_stages * streamed_rows * 2 * 4
    keep_mask = cfg.BLOCK_M * cfg.BLOCK_N if dropout else 0
    return tiles + cfg.num_stages * cfg.BLOCK_M * cfg.BLOCK_N * bias_elem + row_stats + keep_mask


def _fit(cfg: KernelConfig, head_dim: int, elem: int, smem_limit: int, streams_keys: bool = True,
         resident_tiles: int = 2, bias_elem: int = 0, dropout: bool = False) -> KernelConfig:
    """Trim the pipeline depth until the shared-memory estimate fits the device."""
    while cfg.num_stages > 1 and _smem_bytes(cfg, head_dim, elem, streams_keys, resident_tiles, bias_elem,
                                             dropout) > smem_limit:
        cfg = KernelConfig(cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, cfg.num_stages - 1)
    return cfg


def _with_blocks(cfg: KernelConfig, blocks: tuple[int, int] | None) -> KernelConfig:
    # With a block mask, the kernels' tiles are the block mask's tiles.
    return cfg if blocks is None else KernelConfig(blocks[0], blocks[1], cfg.num_warps, cfg.num_stages)


def forward_config(head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device,
                   seqlen_q: int = 4096, bias_elem: int = 0, blocks: tuple[int, int] | None = None,
                   dropout: bool = False) -> KernelConfig:
    """Config of ``_fwd_kernel``; head_dim is the padded (power-of-two) head dim.

    ``bias_elem``: bytes per element of the additive bias (0 without one); ``blocks``:
    (BLOCK_M, BLOCK_N) imposed by a block mask; ``dropout``: whether a keep mask is drawn.
    All three count in the shared-memory fit.
    """
    if _override["forward"] is not None:  # a block mask's tile sizes still rule: its lists index them
        return _with_blocks(_override["forward"], blocks)
    if interpreting() or device.type != "cuda":
        return _with_blocks(INTERPRETER_CONFIG, blocks)
    (major, _), smem = device_limits(device.index if device.index is not None else torch.cuda.current_device())
    elem = 4 if dtype == torch.float32 else 2
    if dtype == torch.float32:
        cfg = KernelConfig(64, 32 if head_dim > 64 else 64, 4, 2)
    elif major >= 9:  # Hopper: large tiles keep the tensor cores fed
        # Measured on the H200 (benchmarks/tune_configs.py, docs/performance.md): at
        # short sequences small tiles give more programs and a finer causal diagonal.
        if head_dim <= 64:
            cfg = KernelConfig(64, 64, 4, 3) if seqlen_q <= 2048 else KernelConfig(128, 128, 8, 3)
        elif head_dim <= 128:
            # Causal N = 1k: 283 TFLOP/s at 64 × 64 with 4 warps against 254 at 128 × 128
            # (2026-11-30 sweep); the diagonal is a large share of so few tiles.
            cfg = KernelConfig(64, 64, 4, 3) if causal and seqlen_q <= 1024 else KernelConfig(128, 128, 8, 3)
        else:
            cfg = KernelConfig(128, 64, 8, 2)
    elif major >= 8:
        cfg = KernelConfig(128, 64, 4, 3) if head_dim <= 64 else KernelConfig(128, 32 if head_dim > 128 else 64, 8, 2)
    else:
        cfg = KernelConfig(64, 32, 4, 2)
    # Only Q stays resident.
    return _fit(_with_blocks(cfg, blocks), head_dim, elem, smem, resident_tiles=1, bias_elem=bias_elem, dropout=dropout)


def backward_configs(head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device, bias_elem: int = 0,
                     blocks: tuple[int, int] | None = None, dropout: bool = False) -> tuple[KernelConfig, KernelConfig]:
    """Configs of ``_bwd_dkdv_kernel`` and ``_bwd_dq_kernel`` (they stream different tiles);
    ``bias_elem`` and ``dropout`` as in :func:`forward_config`; ``blocks``: a block mask's
    dQ tiles (BlockMask.backward_blocks)."""
    # The dK/dV pass runs the dQ tiles transposed (BlockMask.dkdv_blocks): Q rows by the dQ
    # tiles' key width (backward_block_n), K/V rows by their query height (block_m).
    dkdv_blocks = (blocks[1], blocks[0]) if blocks is not None else None
    if _override["backward"] is not None:
        dkdv, dq = _override["backward"]
        return _with_blocks(dkdv, dkdv_blocks), _with_blocks(dq, blocks)
    if interpreting() or device.type != "cuda":
        return _with_blocks(INTERPRETER_CONFIG, dkdv_blocks), _with_blocks(INTERPRETER_CONFIG, blocks)
    (major, _), smem = device_limits(device.index if device.index is not None else torch.cuda.current_device())
    elem = 4 if dtype == torch.float32 else 2
    if dtype == torch.float32:
        dkdv = dq = KernelConfig(32, 32, 4, 1)
    elif major >= 9:
        # Measured on the H200 (benchmarks/tune_configs.py, docs/performance.md).
        if head_dim <= 64:
            dkdv, dq = KernelConfig(32, 128, 4, 3), KernelConfig(128, 64, 4, 3)
        elif head_dim <= 128:
            dkdv, dq = KernelConfig(64, 128, 8, 3), KernelConfig(128, 64, 8, 3)
        else:
            # d256 (N = 4k, non-causal): dK/dV 120 TFLOP/s against 77 for the old 32 x 64 w4 s1
            # (its dK and dV accumulators spilled); dQ 111 against 78 (128 rows: wgmma, which
            # 32 rows cannot use). Each swept with the other kernel at the old config. Their
            # tiles fill ~200 KiB of shared memory, so a bias or a keep mask (not swept) keeps
            # the old ones.
            if bias_elem or dropout:
                dkdv = dq = KernelConfig(32, 64, 4, 1)
            else:
                dkdv, dq = KernelConfig(64, 64, 8, 2), KernelConfig(128, 64, 8, 1)
    else:
        dkdv = dq = KernelConfig(64, 64, 4, 2) if head_dim <= 64 else KernelConfig(32, 64, 4, 1)
    table_dkdv_area = dkdv.BLOCK_M * dkdv.BLOCK_N
    dkdv, dq = _with_blocks(dkdv, dkdv_blocks), _with_blocks(dq, blocks)
    if major >= 9 and dtype != torch.float32 and dkdv.BLOCK_M * dkdv.BLOCK_N > table_dkdv_area:
        # A block mask's dK/dV tile larger than the table's: at d64 the mask's 64 x 128 with
        # the table's 4 warps ran the causal backward 3.6x the built-in's (spilled dK/dV
        # accumulators); 8 warps at 2 stages ran it 1.03x (H200, N = 16k; docs/performance.md).
        dkdv = KernelConfig(dkdv.BLOCK_M, dkdv.BLOCK_N, 8, 2)
    return (_fit(dkdv, head_dim, elem, smem, streams_keys=False, bias_elem=bias_elem, dropout=dropout),
            _fit(dq, head_dim, elem, smem, bias_elem=bias_elem, dropout=dropout))
