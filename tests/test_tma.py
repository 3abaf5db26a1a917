"""The kernels' tiles through tensor descriptors (FLASHTILE_TMA=1), against the oracle.

On the CPU the Triton interpreter runs the descriptor path (its loads zero-fill past the
tensor's edges as TMA does); the gpu tests run it on the H200.
"""

from __future__ import annotations

import pytest
import torch

import flashtile
from flashtile.kernels import configs, launch, tma
from helpers import assert_grads_match_oracle

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def descriptors(monkeypatch):
    """FLASHTILE_TMA=1 on the Triton backend; counts the launches that built descriptors.
    The Gluon kernels are switched off: on sm_90 they would take the calls these tests time
    the Triton descriptor path on."""
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("FLASHTILE_TMA", "1")
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    built = []
    make = tma.tile_descriptors

    def counting(tensors, rows, head_dim_padded):
        built.append((len(tensors), rows, head_dim_padded))
        return make(tensors, rows, head_dim_padded)

    monkeypatch.setattr(tma, "tile_descriptors", counting)
    if HAS_CUDA and not tma.compiles(2):
        # Configs at 2 stages keep the pointer path on this Triton (kernels/tma.py): run them
        # at 1 stage here, so that every launch of these tests goes through descriptors.
        def one_stage(cfg):
            return configs.KernelConfig(cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, 1) if cfg.num_stages == 2 else cfg

        forward, backward = launch.forward_config, launch.backward_configs
        monkeypatch.setattr(launch, "forward_config", lambda *a, **kw: one_stage(forward(*a, **kw)))
        monkeypatch.setattr(launch, "backward_configs",
                            lambda *a, **kw: tuple(one_stage(c) for c in backward(*a, **kw)))
    return built


def qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, layout, dtype=torch.float32):
    def make(seqlen, heads):
        shape = (batch, seqlen, heads, headdim) if layout == "bshd" else (batch, heads, seqlen, headdim)
        return torch.randn(shape, device=DEVICE, dtype=dtype, requires_grad=True)
    return make(seqlen_q, heads_q), make(seqlen_k, heads_kv), make(seqlen_k, heads_kv)


CASES = {  # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, layout, options)
    "odd-gqa-causal-d40": (2, 17, 45, 4, 2, 40, "bshd", dict(causal=True)),
    "q-longer-d80-bhsd": (1, 113, 33, 2, 1, 80, "bhsd", dict()),
    "one-query-window-softcap": (1, 1, 70, 2, 2, 16, "bshd", dict(window_size=(20, 0), softcap=5.0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_descriptor_path_matches_oracle(descriptors, name):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, layout, options = CASES[name]
    q, k, v = qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, layout)
    out = flashtile.attention(q, k, v, layout=layout, **options)
    assert descriptors, "the forward did not take the descriptor path"
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert len(descriptors) == 3, "forward, dK/dV and dQ each take the descriptor path"
    assert_grads_match_oracle(out, grads, q, k, v, dout, layout=layout, **options)


def test_packed_batches_and_unaddressable_strides_keep_the_pointer_path(descriptors):
    # A descriptor zero-fills at the end of the packed tensor, not of each sequence.
    x = torch.randn(30, 2, 16, device=DEVICE)
    cu = torch.tensor([0, 13, 30], dtype=torch.int32, device=DEVICE)
    flashtile.flash_attn_varlen_func(x, x, x, cu, cu, 17, 17, causal=True)
    # Three heads of a 4-byte head dim of 3: rows 36 bytes apart, not a multiple of 16.
    q = torch.randn(1, 9, 3, 3, device=DEVICE)
    out = flashtile.attention(q, q, q)
    assert not descriptors
    expected = flashtile.naive_attention(q.double(), q.double(), q.double())
    assert (out.double() - expected).abs().max() < 1e-5


def test_descriptors_are_opt_in(monkeypatch):
    monkeypatch.delenv("FLASHTILE_TMA", raising=False)
    assert not tma.requested()
    monkeypatch.setenv("FLASHTILE_TMA", "1")
    assert tma.requested()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("headdim", [64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_descriptor_path(descriptors, dtype, headdim, causal):
    q, k, v = qkv(2, 1000, 1203, 8, 2, headdim, "bshd", dtype)
    out = flashtile.attention(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert len(descriptors) == 3, "forward, dK/dV and dQ each take the descriptor path"
    assert_grads_match_oracle(out, grads, q, k, v, dout, causal=causal)


def test_the_layout_check_reads_each_tensors_start_and_strides():
    base = torch.randn(2, 64, 4, 64, dtype=torch.bfloat16)
    bhsd = base.transpose(1, 2)  # strides (16384, 64, 256, 1): rows of 128 bytes
    assert tma.layout_addressable(bhsd)
    # Same shape and strides, a start 2 bytes on: the remembered shape part must not answer for it.
    shifted = torch.randn(2 * 64 * 4 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 64, 4, 64).transpose(1, 2)
    assert shifted.shape == bhsd.shape and shifted.stride() == bhsd.stride()
    assert not tma.layout_addressable(shifted)
    rows_120_bytes = torch.randn(2, 64, 4, 60, dtype=torch.bfloat16).transpose(1, 2)
    assert not tma.layout_addressable(rows_120_bytes)  # a stride of 120 bytes: not a multiple of 16
    assert tma.layout_addressable(base[..., :60].transpose(1, 2))  # fewer columns, rows still 128 bytes
    assert not tma.layout_addressable(base.transpose(2, 3))  # last stride not 1
    assert not tma.layout_addressable(base[:1].expand(2, -1, -1, -1))  # a zero stride over 2 entries
    assert tma.layout_addressable(base[:1].expand(1, -1, -1, -1))  # one entry: its stride is not read
