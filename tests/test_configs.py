"""Launch configs fit the GPU's shared memory, bias tiles, dropout and block-mask tiles included.

Runs anywhere: the device's limits are stubbed with the H200's (232448 bytes per block,
compute capability 9.0). Regression: with a float32 bias, the d128 dQ kernel's table
config (128, 64, 8 warps, 3 stages) asked Triton for 262144 bytes on the H200 and
failed to launch (OutOfResources), because the fit did not count the bias tile.
"""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels import configs
from flashtile.kernels.configs import _smem_bytes

H200_SMEM = 232448


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(configs, "interpreting", lambda: False)
    monkeypatch.setattr(configs, "device_limits", lambda index: ((9, 0), H200_SMEM))
    return torch.device("cuda", 0)


def elem_size(dtype):
    return torch.empty(0, dtype=dtype).element_size()


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("blocks", [None, (64, 64), (128, 128)])
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_configs_fit_shared_memory(h200, head_dim, dtype, bias_dtype, blocks, dropout):
    elem = elem_size(dtype)
    bias_elem = elem_size(bias_dtype) if bias_dtype is not None else 0
    for causal in (False, True):
        fit = dict(bias_elem=bias_elem, blocks=blocks, dropout=dropout)
        fwd = configs.forward_config(head_dim, dtype, causal, h200, **fit)
        dkdv, dq = configs.backward_configs(head_dim, dtype, causal, h200, **fit)
        if blocks is not None:
            assert all((c.BLOCK_M, c.BLOCK_N) == blocks for c in (fwd, dq))
            assert (dkdv.BLOCK_N, dkdv.BLOCK_M) == blocks
        for cfg, streams_keys, resident in ((fwd, True, 1), (dkdv, False, 2), (dq, True, 2)):
            need = _smem_bytes(cfg, head_dim, elem, streams_keys, resident, bias_elem, dropout)
            if blocks is None:  # the table's own tiles always fit
                assert need <= H200_SMEM, (cfg, need)
            else:  # a block mask imposes its tiles: trimming stages is all the fit can do
                assert need <= H200_SMEM or cfg.num_stages == 1, (cfg, need)


def test_bias_trims_pipeline_depth(h200):
    plain = configs.backward_configs(128, torch.bfloat16, False, h200)[1]
    with_bias = configs.backward_configs(128, torch.bfloat16, False, h200, bias_elem=4)[1]
    assert (plain.BLOCK_M, plain.BLOCK_N) == (with_bias.BLOCK_M, with_bias.BLOCK_N)
    assert with_bias.num_stages < plain.num_stages
    # The failing launch's figure, reproduced by the estimate with the bias counted.
    assert _smem_bytes(plain, 128, 2, True, 2, bias_elem=4) == 262144


def test_dropout_trims_the_d128_forward_pipeline(h200):
    # The GPU suite's failing launch: the d128 causal forward (128 × 128, 3 stages) with
    # dropout asked for 245760 bytes; the keep mask's 16 KiB layout change was not counted.
    plain = configs.forward_config(128, torch.bfloat16, True, h200)
    with_dropout = configs.forward_config(128, torch.bfloat16, True, h200, dropout=True)
    assert _smem_bytes(plain, 128, 2, True, 1, 0, dropout=True) == 245760
    assert (plain.num_stages, with_dropout.num_stages) == (3, 2)


def test_an_override_keeps_the_block_masks_tiles(h200):
    # The block mask's lists count tiles of its own size: a tuning override must not change
    # them (it did once, and the kernels read past the lists).
    from flashtile.kernels.configs import KernelConfig, override

    with override(forward=KernelConfig(16, 16, 1, 1), backward=(KernelConfig(16, 16, 1, 1),) * 2):
        fwd = configs.forward_config(64, torch.bfloat16, True, h200, blocks=(32, 64))
        dkdv, dq = configs.backward_configs(64, torch.bfloat16, True, h200, blocks=(32, 64))
        plain = configs.forward_config(64, torch.bfloat16, True, h200)
    assert all((c.BLOCK_M, c.BLOCK_N, c.num_warps) == (32, 64, 1) for c in (fwd, dq))
    assert (dkdv.BLOCK_M, dkdv.BLOCK_N, dkdv.num_warps) == (64, 32, 1)  # the dK/dV pass runs them transposed
    assert (plain.BLOCK_M, plain.BLOCK_N) == (16, 16)


def test_block_mask_tiles_that_do_not_fit_get_a_clear_error():
    pytest.importorskip("triton")
    from triton.runtime.errors import OutOfResources

    from flashtile.kernels.launch import _block_mask_tiles_must_fit

    with pytest.raises(ValueError, match=r"^block_mask: its 128×128 tiles do not fit in this GPU's shared memory at "
                                         r"headdim 256, torch.float32 .*block_m=64, block_n=64"):
        with _block_mask_tiles_must_fit((128, 128), 256, torch.float32):
            raise OutOfResources(294912, 232448, "shared memory")


def test_a_block_masks_larger_dkdv_tile_gets_eight_warps(h200):
    # d64's table dK/dV tile is 32 x 128 at 4 warps; a block mask's default backward tiles
    # make it 64 x 128, which at 4 warps spilled its accumulators (3.6x the built-in's time
    # on the H200). Tiles no larger than the table's keep its warps and stages.
    table, _ = configs.backward_configs(64, torch.bfloat16, True, h200)
    masked, _ = configs.backward_configs(64, torch.bfloat16, True, h200, blocks=(128, 64))
    assert (table.BLOCK_M * table.BLOCK_N, table.num_warps) == (32 * 128, 4)
    assert (masked.BLOCK_M, masked.BLOCK_N, masked.num_warps, masked.num_stages) == (64, 128, 8, 2)
    same_size, _ = configs.backward_configs(128, torch.bfloat16, True, h200, blocks=(128, 64))
    assert same_size == configs.backward_configs(128, torch.bfloat16, True, h200)[0]
