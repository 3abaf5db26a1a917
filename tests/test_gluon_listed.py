"""The block-sparse Gluon kernels: the forward (gluon_fwd._fwd_listed_kernel) and the backward
(gluon_bwd._dkdv_listed_kernel, _dq_listed_kernel) walk a block mask's tile lists with the dense
kernels' partitions, mask_mod evaluated in the kernels on partial tiles.

They run under FLASHTILE_GLUON=1 / FLASHTILE_GLUON_BWD=1 (and under auto where
hopper.LISTED_UNDER_AUTO) for calls with a block mask of 128-row Q tiles and 64- or 128-key K/V
tiles (the backward: 64-key backward tiles, head dims up to 128). Their oracle
tests need an sm_90 GPU; on the CPU the kernel is compiled for sm_90 by
tests/test_compile_check.py (tools/compile_check.listed_variants) and their host side is tested
here with the launches stubbed.
"""

from __future__ import annotations

import pytest
import torch
import triton

import flashtile
from flashtile.block_mask import _same_offsets
from flashtile.kernels import hopper
from flashtile.mask_mods import (and_masks, causal_mask, dense_mask, document_mask, mask_mod, or_masks,
                                 prefix_lm_mask, sliding_window_mask)
from helpers import assert_grads_match_oracle
from test_gluon import ON_HOPPER, _RecordLaunch


def test_a_block_mask_hands_each_kernel_its_lists_with_zero_strides_where_shared():
    shared = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 200, block_m=128, block_n=64)
    (idx, partial, count, order, runs), strides, full_range = shared.lists("fwd")
    assert [t is u for t, u in zip((idx, partial, count, order, runs), (shared.kv_indices, shared.kv_partial,
                                                                        shared.kv_count, shared.kv_order,
                                                                        shared.kv_runs))] == [True] * 5
    assert strides == (0, 0, idx.stride(2), 0, 0) and full_range
    per_head = flashtile.create_block_mask(every_other_head_causal, 2, 4, 300, 200, block_m=128, block_n=64)
    (idx, _, count, _, _), strides, _ = per_head.lists("dkdv")
    assert idx is per_head.q_indices
    assert strides == (idx.stride(0), idx.stride(1), idx.stride(2), count.stride(0), count.stride(1))


def test_the_listed_forward_takes_128_row_tiles_of_64_or_128_keys():
    def tiles(block_m, block_n):
        return flashtile.create_block_mask(causal_mask(), 1, 1, 256, 256, block_m=block_m, block_n=block_n)

    for head_dim in (40, 64, 96, 128):
        assert hopper.listed_tiles_fit(tiles(128, 64), head_dim) and hopper.listed_tiles_fit(tiles(128, 128), head_dim)
    # d > 128 runs the d256 kernel, whose two stages of 128 keys would need 256 KiB of shared memory
    assert hopper.listed_tiles_fit(tiles(128, 64), 256) and not hopper.listed_tiles_fit(tiles(128, 128), 192)
    for block_m, block_n in ((64, 64), (128, 32), (256, 64), (128, 256)):
        assert not hopper.listed_tiles_fit(tiles(block_m, block_n), 128)
    assert hopper._listed_stages(128, 128, 16384) == hopper._config(128, 16384)[1]
    assert hopper._listed_stages(128, 64, 1024) == 3 and hopper._listed_stages(256, 64, 1024) == 2


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("head_dim,block_n", [(64, 64), (96, 128), (128, 64), (256, 64)])
def test_the_listed_forward_hands_its_kernel_the_lists_and_descriptors_of_the_block_masks_tiles(monkeypatch,
                                                                                               head_dim, block_n):
    gluon_fwd = hopper._gluon()[0]
    launches = []
    monkeypatch.setattr(gluon_fwd, "_fwd_listed_kernel", _RecordLaunch(launches, "listed"))
    ids = torch.arange(333, dtype=torch.int32) // 100
    mask = document_mask(ids)
    bm = flashtile.create_block_mask(mask, 1, 1, 333, 333, block_m=128, block_n=block_n)
    q, out = (torch.randn(2, 6, 333, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, 333, head_dim, dtype=torch.bfloat16) for _ in range(2))
    lse = hopper.forward(q, k, v, out, head_dim ** -0.5, causal=False, block_mask=bm)
    assert lse.shape == (2, 6, 333)
    ((_, grid, args, constexprs),) = launches
    width = hopper.kernel_head_dim(head_dim)
    assert constexprs["HEAD_DIM"] == width and constexprs["BLOCK_N"] == block_n
    assert constexprs["BLOCK_M"] == 128 and constexprs["MASK_MOD"] is mask.triton_fn()
    q_desc, k_desc, v_desc, o_desc = args[:4]
    assert [d.base for d in (q_desc, k_desc, v_desc, o_desc)] == [q, k, v, out]
    assert q_desc.block_shape == o_desc.block_shape == [1, 1, 64, width]
    assert k_desc.block_shape == v_desc.block_shape == [1, 1, block_n, width]
    lists = args[7:12]
    assert [t is u for t, u in zip(lists, (bm.kv_indices, bm.kv_partial, bm.kv_count, bm.kv_order, ids))] == [True] * 5
    assert tuple(args[12:17]) == bm.lists("fwd")[1]
    assert grid == (triton.cdiv(333, 128) * 2 * 6,)


def test_key_tiles_left_to_the_library_get_lists_of_other_widths_sharing_the_backwards():
    free = flashtile.create_block_mask(every_other_head_causal, 2, 6, 333, 300)
    given = flashtile.create_block_mask(every_other_head_causal, 2, 6, 333, 300, block_n=64)
    assert (free.block_n, free.forward_tiles_free, given.forward_tiles_free) == (64, True, False)
    assert free is not given  # (cached apart: one may be widened, the other not)
    wide = free.with_forward_key_tiles(128)
    assert wide is free.with_forward_key_tiles(128) and free.with_forward_key_tiles(64) is free
    assert (wide.block_n, wide.backward_block_n, wide.forward_tiles_free) == (128, 64, False)
    square = flashtile.create_block_mask(every_other_head_causal, 2, 6, 333, 300, block_n=128)
    for part in ("indices", "partial", "count", "order", "runs"):
        assert torch.equal(getattr(wide, "kv_" + part), getattr(square, "kv_" + part))  # 128-key forward lists
        for backward in ("dq", "q"):  # the backward's lists: the 64-key mask's own
            assert getattr(wide, f"{backward}_{part}") is getattr(free, f"{backward}_{part}")
    assert wide.kv_full_range == square.kv_full_range
    with pytest.raises(ValueError, match="block_n=None"):
        given.with_forward_key_tiles(128)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("head_dim,tiles_free,keys", [(128, True, 128), (64, True, 128), (96, True, 128),
                                                      (128, False, 64), (256, True, 64)])
def test_the_listed_forward_widens_key_tiles_left_to_the_library_up_to_d128(monkeypatch, head_dim, tiles_free,
                                                                            keys):
    gluon_fwd = hopper._gluon()[0]
    launches = []
    monkeypatch.setattr(gluon_fwd, "_fwd_listed_kernel", _RecordLaunch(launches, "listed"))
    bm = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 300, block_n=None if tiles_free else 64)
    q, k, v, out = (torch.randn(1, 2, 300, head_dim, dtype=torch.bfloat16) for _ in range(4))
    hopper.forward(q, k, v, out, head_dim ** -0.5, causal=False, block_mask=bm)
    ((_, _, args, constexprs),) = launches
    walked = bm.with_forward_key_tiles(keys) if tiles_free else bm
    assert constexprs["BLOCK_N"] == keys and args[1].block_shape[2] == keys
    assert args[7] is walked.kv_indices and tuple(args[12:17]) == walked.lists("fwd")[1]


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_the_listed_backward_hands_each_kernel_its_lists_and_descriptors_of_its_tiles(monkeypatch, head_dim):
    gluon_bwd = hopper._gluon()[3]
    launches = []
    for name in ("_dkdv_listed_kernel", "_dq_listed_kernel"):
        monkeypatch.setattr(gluon_bwd, name, _RecordLaunch(launches, name))
    bm = flashtile.create_block_mask(every_other_head_causal, 2, 6, 300, 333, block_m=128, block_n=128)
    assert hopper.listed_backward_fits(bm, head_dim)
    q, dout, dq, out = (torch.randn(2, 6, 300, head_dim, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.randn(2, 2, 333, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse = torch.randn(2, 6, 300)
    monkeypatch.delenv("FLASHTILE_GLUON_DQ_STATS", raising=False)
    hopper.backward(q, k, v, out, dout, lse, None, head_dim ** -0.5, False, dq, dk, dv, block_mask=bm)
    # dQ first: under auto, as under 1, it writes the rows' LSE·log2(e) and D, which the dK/dV
    # kernel reads (under 0 the preprocess does: test_gluon.py's descriptor test)
    (dq_name, dq_grid, dq_args, dq_constexprs), (dkdv_name, dkdv_grid, dkdv_args, dkdv_constexprs) = launches
    width = hopper.kernel_head_dim(head_dim)
    assert (dkdv_name, dq_name) == ("_dkdv_listed_kernel", "_dq_listed_kernel")
    lse2, delta = dq_args[5:7]
    assert lse2.shape == delta.shape == (2 * 6, 384) and [d.base for d in dkdv_args[6:8]] == [lse2, delta]
    assert dq_args[8:12] == (out, dout, lse, lse) and dq_constexprs["ROW_STATS"] and not dq_constexprs["HAS_DLSE"]
    # dK/dV: 64-row Q tiles past 128 keys, half per consumer warpgroup; the transposed lists
    assert (dkdv_constexprs["BLOCK_M"], dkdv_constexprs["BLOCK_N"]) == bm.dkdv_blocks == (64, 128)
    assert [d.base for d in dkdv_args[:6]] == [q, dout, k, v, dk, dv]
    assert [d.block_shape for d in dkdv_args[:6]] == [[1, 1, 64, width]] * 2 + [[1, 1, 64, width]] * 4
    assert [d.block_shape for d in dkdv_args[6:8]] == [[1, 64], [1, 64]]
    assert [t is u for t, u in zip(dkdv_args[8:12], (bm.q_indices, bm.q_partial, bm.q_count, bm.q_order))] == \
        [True] * 4
    assert tuple(dkdv_args[13:18]) == bm.lists("dkdv")[1] and dkdv_grid == (triton.cdiv(333, 128) * 2 * 2,)
    # dQ: 128-row Q tiles (a half per warpgroup) past 64 keys; the dQ pass's lists
    assert (dq_constexprs["BLOCK_M"], dq_constexprs["BLOCK_N"]) == bm.backward_blocks == (128, 64)
    assert [d.base for d in dq_args[:5]] == [q, dout, k, v, dq]
    assert [d.block_shape for d in dq_args[:5]] == [[1, 1, 64, width]] * 5  # 64 rows (halves) and 64 keys
    assert dq_args[20] == head_dim
    assert [t is u for t, u in zip(dq_args[21:25], (bm.dq_indices, bm.dq_partial, bm.dq_count, bm.dq_order))] == \
        [True] * 4
    assert tuple(dq_args[26:31]) == bm.lists("dq")[1] and dq_grid == (triton.cdiv(300, 128) * 2 * 6,)
    jitted = mask_mod(every_other_head_causal).triton_fn()
    for constexprs in (dkdv_constexprs, dq_constexprs):
        assert constexprs["HEAD_DIM"] == width and constexprs["MASK_MOD"] is jitted
    wide = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 333, block_m=128, block_n=128, backward_block_n=128)
    assert not hopper.listed_backward_fits(wide, head_dim) and not hopper.listed_backward_fits(bm, 256)


# -- GPU: against the oracle -------------------------------------------------------------------

def every_other_head_causal(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) | (h % 2 == 1)


def causal_shifted_by_batch(b, h, q_idx, kv_idx):
    # each batch entry sees 96 more keys than the one before: lists that differ per batch entry
    return kv_idx <= q_idx + 96 * b


def sink_64_and_window_300(b, h, q_idx, kv_idx):
    # two runs of full tiles per row, and partial tiles at both edges of the window
    return (kv_idx <= q_idx) & ((kv_idx < 64) | (q_idx - kv_idx < 300))


def every_other_64_keys(b, h, q_idx, kv_idx):
    # full tiles that are not consecutive at 64-key tiles; every tile partial at 128 keys
    return ((kv_idx // 64) % 2 == 0) | (q_idx == kv_idx)


MASKS = {
    "causal": lambda length: causal_mask(),
    "sink-and-window": lambda length: sink_64_and_window_300,
    "every-other-64-keys": lambda length: every_other_64_keys,
    "per-head": lambda length: every_other_head_causal,
    "per-batch": lambda length: causal_shifted_by_batch,
    "prefix-lm-100-or-window": lambda length: or_masks(prefix_lm_mask(100),
                                                       and_masks(causal_mask(), sliding_window_mask(150))),
    "documents": lambda length: document_mask(
        (torch.arange(length, device="cuda", dtype=torch.int32) * 5 // max(length, 1)).to(torch.int32)),
}
# (mask, head dim, K/V tile, (seqlen_q, seqlen_k)); dtype, layout and GQA ratio rotate below.
CASES = [
    ("causal", 128, 128, (1000, 1000)), ("causal", 128, 64, (113, 203)), ("causal", 64, 128, (203, 113)),
    ("causal", 64, 64, (1, 1)), ("causal", 256, 64, (17, 17)), ("causal", 96, 128, (1000, 1000)),
    ("causal", 40, 64, (300, 4100)), ("causal", 128, 128, (1, 1000)),
    ("sink-and-window", 128, 64, (1000, 1000)), ("sink-and-window", 128, 128, (1000, 1000)),
    ("sink-and-window", 256, 64, (1000, 1000)), ("sink-and-window", 64, 64, (1000, 17)),
    ("every-other-64-keys", 128, 64, (1000, 1000)), ("every-other-64-keys", 64, 128, (203, 1000)),
    ("per-head", 128, 128, (1000, 1000)), ("per-head", 80, 64, (113, 203)),
    ("per-batch", 128, 64, (300, 500)), ("per-batch", 256, 64, (203, 113)),
    ("prefix-lm-100-or-window", 128, 128, (1000, 1000)), ("prefix-lm-100-or-window", 64, 64, (17, 203)),
    ("documents", 128, 128, (1000, 1000)), ("documents", 128, 64, (203, 203)), ("documents", 256, 64, (113, 113)),
    # key tiles left to the library (block_n=None): the forward walks 128-key lists up to d128
    ("documents", 128, None, (1000, 1000)), ("per-head", 64, None, (300, 500)), ("causal", 256, None, (113, 203)),
]


class ListedCalls:
    """The block masks the block-sparse Gluon forward and backward ran with."""

    def __init__(self):
        self.forward, self.backward = [], []


@pytest.fixture
def listed_calls(monkeypatch):
    """FLASHTILE_GLUON=1 and FLASHTILE_GLUON_BWD=1, and the block masks the block-sparse Gluon
    kernels ran with (a backward they do not take, d256's, runs on the Triton kernels)."""
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    calls = ListedCalls()
    forward, backward = hopper._listed_forward, hopper._listed_backward

    def counted_forward(gluon_fwd, q, k, v, out, lse, softmax_scale, block_mask, *args):
        calls.forward.append(block_mask)
        return forward(gluon_fwd, q, k, v, out, lse, softmax_scale, block_mask, *args)

    def counted_backward(*args):
        calls.backward.append(args[-1])
        return backward(*args)

    monkeypatch.setattr(hopper, "_listed_forward", counted_forward)
    monkeypatch.setattr(hopper, "_listed_backward", counted_backward)
    return calls


def _inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, layout):
    def make(seqlen, heads):
        if layout == "bhsd":  # head-major storage, seen through a (B, S, H, D) view
            return torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=dtype).transpose(1, 2) \
                .requires_grad_()
        return torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype, requires_grad=True)

    return make(seqlen_q, heads_q), make(seqlen_k, heads_kv), make(seqlen_k, heads_kv)


def _oracle_bias(visible: torch.Tensor) -> torch.Tensor:
    return torch.zeros(visible.shape, device=visible.device).masked_fill(~visible, float("-inf"))


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("case", CASES, ids=[f"{m}-d{d}-n{n}-q{sq}k{sk}" for m, d, n, (sq, sk) in CASES])
def test_gpu_listed_forward_matches_the_oracle(listed_calls, case):
    name, head_dim, block_n, (seqlen_q, seqlen_k) = case
    index = CASES.index(case)
    dtype = (torch.bfloat16, torch.float16)[index % 2]
    layout = ("bshd", "bhsd")[(index // 2) % 2]
    heads_q, heads_kv = [(4, 1), (4, 2), (2, 2)][index % 3]
    batch = 2
    mask = mask_mod(MASKS[name](max(seqlen_q, seqlen_k)))
    per_batch, per_head = name == "per-batch", name == "per-head"
    bm = flashtile.create_block_mask(mask, batch if per_batch else 1, heads_q if per_head else 1, seqlen_q, seqlen_k,
                                     "cuda", block_m=128, block_n=block_n)
    q, k, v = _inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, layout)
    out = flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm, layout="bshd")
    walked = bm.with_forward_key_tiles(128) if block_n is None and head_dim <= 128 else bm
    assert listed_calls.forward == [walked], "the call did not take the block-sparse Gluon forward"
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # The block-sparse Gluon backward at head dims up to 128; d256 on the Triton kernels.
    assert listed_calls.backward == ([bm] if head_dim <= 128 else [])
    visible = dense_mask(mask, batch, heads_q, seqlen_q, seqlen_k, "cuda")
    assert visible.any(dim=-1).all(), "the masks here keep a key in every row (the oracle's -inf bias needs one)"
    assert_grads_match_oracle(out, grads, q, k, v, dout, bias=_oracle_bias(visible))


def late_queries_causal(b, h, q_idx, kv_idx):
    # queries before 130 see nothing: a whole Q tile with an empty list (rows 0..127), and two
    # empty rows (128, 129) beside visible ones in the next tile
    return (q_idx >= 130) & (kv_idx <= q_idx)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("block_n", [64, 128])
def test_gpu_listed_forward_gives_rows_that_see_nothing_zeros_and_an_lse_of_minus_infinity(listed_calls, block_n):
    seqlen, seen_from = 500, 130
    bm = flashtile.create_block_mask(late_queries_causal, 1, 1, seqlen, seqlen, "cuda", block_m=128, block_n=block_n)
    assert int(bm.kv_count[0, 0, 0]) == 0, "the first Q tile's list is empty"
    q, k, v = _inputs(2, seqlen, seqlen, 4, 2, 128, torch.bfloat16, "bshd")
    out, lse = flashtile.attention(q, k, v, mask_mod=late_queries_causal, block_mask=bm, return_lse=True)
    assert len(listed_calls.forward) == 1
    assert torch.equal(out[:, :seen_from], torch.zeros_like(out[:, :seen_from]))
    assert torch.isneginf(lse[:, :, :seen_from]).all() and torch.isfinite(lse[:, :, seen_from:]).all()
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert len(listed_calls.backward) == 1
    assert torch.equal(dq[:, :seen_from], torch.zeros_like(dq[:, :seen_from]))
    # The rows that see keys, against the oracle on those rows alone (rows are independent; K and
    # V get gradients from them only).
    rows = q[:, seen_from:].detach().requires_grad_()
    visible = dense_mask(mask_mod(late_queries_causal), 1, 1, seqlen, seqlen, "cuda")[:, :, seen_from:]
    assert_grads_match_oracle(out[:, seen_from:], (dq[:, seen_from:], dk, dv), rows, k, v, dout[:, seen_from:],
                              bias=_oracle_bias(visible))


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
def test_gpu_what_the_listed_forward_does_not_take_runs_on_the_triton_kernels(listed_calls, monkeypatch):
    q, k, v = (torch.randn(1, 300, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    reference = flashtile.attention(q, k, v, causal=True)
    # (the kernels differ, so the outputs agree to bf16 rounding, not bit for bit)
    for tiles in ((64, 64), (128, 32)):  # Q tiles other than the kernel's 128 rows; 32-key tiles
        bm = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 300, "cuda", *tiles)
        torch.testing.assert_close(flashtile.attention(q, k, v, mask_mod=bm.mask, block_mask=bm), reference,
                                   atol=2e-2, rtol=2e-2)
    narrow = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 300, "cuda", 128, 64)
    q64 = q[..., :64].float()
    flashtile.attention(q64, q64, q64, mask_mod=narrow.mask, block_mask=narrow)  # float32
    assert listed_calls.forward == []
    # backward tiles of 32 keys: the Triton backward
    odd = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 300, "cuda", 128, 64, backward_block_n=32)
    qg = q.detach().clone().requires_grad_()
    flashtile.attention(qg, k, v, mask_mod=odd.mask, block_mask=odd).sum().backward()
    assert listed_calls.forward == [odd] and listed_calls.backward == []
    wide = flashtile.create_block_mask(causal_mask(), 1, 1, 300, 300, "cuda", 128, 128)
    monkeypatch.setenv("FLASHTILE_GLUON", "auto")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "auto")
    flashtile.attention(qg, k, v, mask_mod=wide.mask, block_mask=wide).sum().backward()
    assert listed_calls.forward[1:] == ([wide] if hopper.LISTED_UNDER_AUTO[False] else [])
    assert listed_calls.backward == ([wide] if hopper.LISTED_UNDER_AUTO[True] else [])
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    torch.testing.assert_close(flashtile.attention(q, k, v, mask_mod=wide.mask, block_mask=wide), reference,
                               atol=2e-2, rtol=2e-2)
    assert listed_calls.forward[-1] is wide


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device beside the CPU")
def test_gpu_a_block_mask_built_on_another_device_is_refused():
    q = torch.randn(1, 256, 2, 64, device="cuda", dtype=torch.bfloat16)
    on_cpu = flashtile.create_block_mask(causal_mask(), 1, 1, 256, 256, block_m=128, block_n=64)
    with pytest.raises(ValueError, match=r"^block_mask: built on cpu, q is on cuda:0"):
        flashtile.attention(q, q, q, mask_mod=on_cpu.mask, block_mask=on_cpu)


@pytest.mark.parametrize("lengths,tiles", [((203, 113), (128, 128)), ((1000, 17), (128, 64)), ((17, 17), (16, 16))])
def test_lists_of_one_tile_along_a_dim_are_handed_over(lengths, tiles):
    # One K/V tile: the transposed lists' tile dim has size 1, its stride left as .contiguous()
    # found it (4 in the indices, 1 in the runs). An exact stride comparison refused these on the
    # H200 (the Triton backward of the block-sparse tests).
    bm = flashtile.create_block_mask(sink_64_and_window_300, 1, 1, *lengths, block_m=tiles[0], block_n=tiles[1])
    one_tile_dims = 0
    for kernel in ("fwd", "dq", "dkdv"):
        (idx, partial, count, order, runs), strides, _ = bm.lists(kernel)
        assert _same_offsets(runs, idx) and _same_offsets(order, count) and _same_offsets(partial, count)
        assert strides[2] == idx.stride(2)
        one_tile_dims += sum(n == 1 for n in idx.shape[2:])
    if lengths == (203, 113):  # the H200's case: its transposed lists have one K/V tile
        assert one_tile_dims >= 1


def test_a_mask_mod_gets_wide_tiles_only_where_the_gluon_forward_would_take_the_call(monkeypatch):
    assert hopper.default_block_mask_tiles(torch.zeros(1, 8, 2, 128, dtype=torch.bfloat16), 4096) == (128, 64)

    class OnHopper:  # what default_block_mask_tiles reads of q, on a GPU that can run the kernels
        is_cuda, device = True, torch.device("cuda", 0)

        def __init__(self, head_dim, dtype=torch.bfloat16):
            self.shape, self.dtype = (1, 8, 2, head_dim), dtype

    monkeypatch.setattr(hopper, "_unsupported", lambda index: None)
    monkeypatch.setattr(hopper, "interpreting", lambda: False)
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    assert hopper.default_block_mask_tiles(OnHopper(128), 1024) == (128, 128)
    assert hopper.default_block_mask_tiles(OnHopper(40), 1024) == (128, 128)  # timed (run on d64)
    assert hopper.default_block_mask_tiles(OnHopper(64), 1024) == (128, 64)  # d64 below 4k keys: Triton
    assert hopper.default_block_mask_tiles(OnHopper(64), 4096) == (128, 128)
    assert hopper.default_block_mask_tiles(OnHopper(80), 4096) == (128, 64)  # not timed
    assert hopper.default_block_mask_tiles(OnHopper(256), 4096) == (128, 64)  # 64-key tiles at d256
    assert hopper.default_block_mask_tiles(OnHopper(128, torch.float32), 4096) == (128, 64)
    monkeypatch.setitem(hopper.LISTED_UNDER_AUTO, False, False)
    assert hopper.default_block_mask_tiles(OnHopper(128), 4096) == (128, 64)
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert hopper.default_block_mask_tiles(OnHopper(64), 1024) == (128, 128)
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    assert hopper.default_block_mask_tiles(OnHopper(128), 4096) == (128, 64)
    monkeypatch.setenv("FLASHTILE_GLUON", "gluon")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON"):
        hopper.default_block_mask_tiles(OnHopper(128), 4096)


def test_a_block_sparse_kernel_that_fails_to_build_is_remembered_for_its_mask_alone(monkeypatch):
    # One mask_mod that Gluon cannot build sends that mask to the Triton kernels, not every mask
    # at its head dim (the record was keyed without the mask before).
    class OnHopper:
        is_cuda, device, shape, dtype = True, torch.device("cuda", 0), (1, 8, 2, 128), torch.bfloat16

    monkeypatch.setattr(hopper, "_unsupported", lambda index: None)
    monkeypatch.setattr(hopper, "interpreting", lambda: False)
    monkeypatch.setattr(hopper, "_FAILED", set())
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    broken, other = mask_mod(every_other_head_causal), causal_mask()
    with pytest.warns(RuntimeWarning, match="block-sparse forward kernel .*mask_mod every_other_head_causal"):
        assert hopper.falls_back(RuntimeError("PassManager::run failed"), OnHopper(), backward=False, causal=False,
                                 mask=broken)
    assert hopper.default_block_mask_tiles(OnHopper(), 4096, broken) == (128, 64)
    assert hopper.default_block_mask_tiles(OnHopper(), 4096, other) == (128, 128)
    assert hopper._auto_takes(OnHopper(), 4096, False, False)  # the dense forward too


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
def test_gpu_a_mask_mod_without_a_block_mask_gets_wide_tiles_where_the_gluon_forward_takes_them(listed_calls,
                                                                                                monkeypatch):
    def run(head_dim):
        q = torch.randn(1, 300, 2, head_dim, device="cuda", dtype=torch.bfloat16)
        flashtile.attention(q, q, q, mask_mod=sink_64_and_window_300)

    run(128)
    run(64)
    assert [bm.block_n for bm in listed_calls.forward] == [128, 128]
    run(256)  # the d256 kernel takes 64-key tiles
    assert [bm.block_n for bm in listed_calls.forward] == [128, 128, 64]
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    run(128)
    assert len(listed_calls.forward) == 3
    # the Triton kernels, whose default is 64 keys (float32)
    fp32 = torch.zeros(1, 8, 2, 128, device="cuda", dtype=torch.float32)
    assert hopper.default_block_mask_tiles(fp32, 4096) == (128, 64)
