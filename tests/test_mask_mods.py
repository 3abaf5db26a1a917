"""User-defined masks (mask_mod) and block masks, on both backends, against the oracle."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import flashtile
from flashtile.mask_mods import (and_masks, causal_mask, chunked_mask, dense_mask, document_mask, draw, mask_mod,
                                 or_masks, prefix_lm_mask, sliding_window_mask)
from flashtile.testing import max_error
from helpers import assert_grads_match_oracle

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def every_other_head_causal(b, h, q_idx, kv_idx):
    # A user's own mask: causal on even heads, bidirectional on odd ones.
    return (q_idx >= kv_idx) | (h % 2 == 1)


def check_mask(mask, seqlen_q=37, seqlen_k=37, heads_q=4, heads_kv=2, headdim=16, batch=2, blocks=None):
    """Forward and gradients against the oracle; ``blocks`` = (block_m, block_n) builds the
    block mask with those tiles (default: the one attention() builds on the fly)."""
    q = torch.randn(batch, seqlen_q, heads_q, headdim, device=DEVICE, requires_grad=True)
    k = torch.randn(batch, seqlen_k, heads_kv, headdim, device=DEVICE, requires_grad=True)
    v = torch.randn(batch, seqlen_k, heads_kv, headdim, device=DEVICE, requires_grad=True)
    block_mask = None
    if blocks is not None:
        block_mask = flashtile.create_block_mask(mask, batch, heads_q, seqlen_q, seqlen_k, DEVICE, *blocks)
    out = flashtile.attention(q, k, v, mask_mod=mask, block_mask=block_mask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    visible = dense_mask(mask_mod(mask), batch, heads_q, seqlen_q, seqlen_k, DEVICE)
    assert visible.any(dim=-1).all(), "test masks keep a key in every row (the oracle's -inf bias needs one)"
    bias = torch.zeros(visible.shape, device=DEVICE).masked_fill(~visible, float("-inf"))
    assert_grads_match_oracle(out, grads, q, k, v, dout, bias=bias)


def every_other_16_keys(b, h, q_idx, kv_idx):
    # Full tiles that are not consecutive (at 16-key tiles: 0, 2, 4, ...), and the diagonal.
    return ((kv_idx // 16) % 2 == 0) | (q_idx == kv_idx)


def every_other_64_keys(b, h, q_idx, kv_idx):
    # The same at the GPU's default block-mask tiles (128 x 64).
    return ((kv_idx // 64) % 2 == 0) | (q_idx == kv_idx)


def every_other_16_queries(b, h, q_idx, kv_idx):
    # Per K/V tile, full Q tiles that are not consecutive (the dK/dV pass's lists).
    return ((q_idx // 16) % 2 == 0) | (q_idx == kv_idx)


def sink_16_and_window_56(b, h, q_idx, kv_idx):
    # Sink tokens beside a causal window (StreamingLLM): two runs of full tiles per row.
    return (kv_idx <= q_idx) & ((kv_idx < 16) | (q_idx - kv_idx < 56))


def sink_64_and_window_300(b, h, q_idx, kv_idx):
    # The same at the GPU's default block-mask tiles (128 x 64).
    return (kv_idx <= q_idx) & ((kv_idx < 64) | (q_idx - kv_idx < 300))


MASKS = {
    "causal": lambda: causal_mask(),
    "sink-and-window": lambda: sink_64_and_window_300 if DEVICE == "cuda" else sink_16_and_window_56,
    "every-other-key-tile": lambda: every_other_64_keys if DEVICE == "cuda" else every_other_16_keys,
    "causal-window-5": lambda: and_masks(causal_mask(), sliding_window_mask(5)),
    "prefix-lm-9": lambda: prefix_lm_mask(9),
    "chunked-8-or-causal-window": lambda: or_masks(chunked_mask(8), and_masks(causal_mask(), sliding_window_mask(2))),
    "user-per-head": lambda: every_other_head_causal,
}


@pytest.mark.parametrize("name", list(MASKS))
def test_mask_mod_matches_oracle(backend, name):
    check_mask(MASKS[name]())


def test_document_mask(backend):
    doc_ids = torch.tensor([0] * 10 + [1] * 7 + [2] * 20, dtype=torch.int32, device=DEVICE)
    check_mask(and_masks(causal_mask(), document_mask(doc_ids)))


@pytest.mark.parametrize("view", ["every-other", "expanded"])
def test_document_ids_as_a_strided_or_expanded_view(backend, view):
    # The kernels read buffer[i] at buffer + i: before the ids were made contiguous these
    # views gave another mask on the Triton path (max error 2.8), or read past the storage.
    if view == "every-other":
        ids = torch.tensor([0] * 10 + [1] * 7 + [2] * 20, dtype=torch.int32, device=DEVICE)
        ids = torch.stack([ids, ids.flip(0)], -1)[:, 0]
    else:
        ids = torch.tensor([3], dtype=torch.int32, device=DEVICE).expand(37)
    assert ids.stride(0) != 1
    check_mask(and_masks(causal_mask(), document_mask(ids)))


def test_q_and_k_lengths_differ(backend):
    check_mask(prefix_lm_mask(30), seqlen_q=21, seqlen_k=45)


@pytest.mark.parametrize("blocks", [(32, 16), (16, 32)], ids=["32x16", "16x32"])
def test_rectangular_tiles_match_oracle(backend, blocks):
    # The dK/dV pass runs a block mask's tiles transposed (BlockMask.dkdv_blocks), with
    # its own tile lists: rectangular tiles are where that could go wrong.
    check_mask(and_masks(causal_mask(), sliding_window_mask(20)), seqlen_q=45, seqlen_k=70, blocks=blocks)


def test_dkdv_lists_use_the_transposed_tiling():
    bm = flashtile.create_block_mask(causal_mask(), seqlen_q=64, seqlen_k=64, block_m=32, block_n=16)
    assert bm.dkdv_blocks == (16, 32)
    # Per K/V tile of 32 keys, the Q tiles of 16 queries that see it: causal over 4 × 2.
    assert bm.q_indices.shape[-2:] == (2, 4) and bm.kv_indices.shape[-2:] == (2, 4)
    assert bm.q_count[0, 0].tolist() == [4, 2] and bm.q_partial[0, 0].tolist() == [2, 2]


def test_backward_tiles_are_at_most_64_keys_wide_by_default():
    # 128 × 128 tiles suit the forward at d128; the dK/dV pass on them spilled (3.01× the
    # built-in backward on the H200), so the backward tiles keys by 64 unless told otherwise.
    wide = flashtile.create_block_mask(causal_mask(), seqlen_q=256, seqlen_k=256, block_m=128, block_n=128)
    assert wide.backward_blocks == (128, 64) and wide.dkdv_blocks == (64, 128)
    assert wide.kv_indices.shape[-2:] == (2, 2) and wide.dq_indices.shape[-2:] == (2, 4)
    assert wide.q_indices.shape[-2:] == (2, 4)  # per K/V tile of 128 keys, Q tiles of 64 queries
    assert wide.dq_count[0, 0].tolist() == [2, 4] and wide.q_count[0, 0].tolist() == [4, 2]
    # At most 64 wide already: the dQ pass shares the forward's lists.
    narrow = flashtile.create_block_mask(causal_mask(), seqlen_q=256, seqlen_k=256, block_m=128, block_n=64)
    assert narrow.backward_blocks == (128, 64) and narrow.dq_indices is narrow.kv_indices
    told = flashtile.create_block_mask(causal_mask(), seqlen_q=256, seqlen_k=256, block_m=128, block_n=128,
                                       backward_block_n=128)
    assert told.dkdv_blocks == (128, 128) and told.dq_indices is told.kv_indices
    with pytest.raises(ValueError, match=r"^backward_block_n: expected a power of two >= 16, got 48$"):
        flashtile.create_block_mask(causal_mask(), seqlen_q=64, seqlen_k=64, backward_block_n=48)


@pytest.mark.parametrize("tiles", [(32, 32, 16), (16, 32, 16), (32, 16, 32)], ids=["fwd32x32-bwd16", "fwd16x32-bwd16",
                                                                               "fwd32x16-bwd32"])
def test_backward_tiling_apart_from_the_forward_matches_oracle(backend, tiles):
    block_m, block_n, backward_block_n = tiles
    mask = and_masks(causal_mask(), sliding_window_mask(20))
    bm = flashtile.create_block_mask(mask, 2, 4, 45, 70, DEVICE, block_m, block_n, backward_block_n)
    assert bm.backward_blocks == (block_m, backward_block_n)
    # Each pass's lists on its own tiling (a list at the wrong one could still cover the
    # visible keys when every visited tile is partial, which the oracle alone would miss).
    tiles_q, tiles_k = -(-45 // block_m), -(-70 // backward_block_n)
    assert bm.dq_indices.shape[-2:] == (tiles_q, tiles_k) and bm.q_indices.shape[-2:] == (-(-70 // block_m),
                                                                                          -(-45 // backward_block_n))
    for order in (bm.dq_order, bm.q_order):
        assert torch.equal(order.sort(dim=-1).values, torch.arange(order.shape[-1]).expand_as(order).to(order))
    q = torch.randn(2, 45, 4, 16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(2, 70, 2, 16, device=DEVICE, requires_grad=True) for _ in range(2))
    out = flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    visible = dense_mask(mask, 2, 4, 45, 70, DEVICE)
    bias = torch.zeros(visible.shape, device=DEVICE).masked_fill(~visible, float("-inf"))
    assert_grads_match_oracle(out, grads, q, k, v, dout, bias=bias)


def test_block_mask_classifies_tiles():
    bm = flashtile.create_block_mask(causal_mask(), seqlen_q=64, seqlen_k=64, block_m=16, block_n=16)
    # Causal over 4 × 4 tiles: the diagonal is partial, below it full, above it empty.
    assert bm.kv_partial[0, 0].tolist() == [1, 1, 1, 1]
    assert bm.kv_count[0, 0].tolist() == [1, 2, 3, 4]
    assert bm.kv_indices[0, 0, 3, :4].tolist() == [3, 0, 1, 2]  # partial first, then full
    assert bm.q_count[0, 0].tolist() == [4, 3, 2, 1]
    assert abs(bm.visited_fraction - 10 / 16) < 1e-9
    # Tiles that hang past the last query or key are never full (the kernels would
    # read past the end without the mask's bounds checks).
    ragged = flashtile.create_block_mask(causal_mask(), seqlen_q=40, seqlen_k=40, block_m=16, block_n=16)
    assert ragged.kv_partial[0, 0].tolist() == [1, 1, 3] and ragged.kv_count[0, 0].tolist() == [1, 2, 3]


def later_half_causal(b, h, q_idx, kv_idx):  # a plain function, as FlexAttention users write them
    return (q_idx >= kv_idx) & (kv_idx >= q_idx // 2)


def test_plain_function_pairs_with_its_block_mask(backend):
    # FlexAttention's idiom: the same plain function to create_block_mask and to attention.
    # It was wrapped anew by each, and the pair was refused as "another mask_mod".
    check_mask(later_half_causal, blocks=(16, 16))


def test_lambda_mask_mod_runs_on_the_reference_backend_and_is_refused_by_the_kernels(backend):
    # triton.jit compiles a def from its source: a lambda was a SyntaxError deep in the launch.
    mask = mask_mod(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (kv_idx >= q_idx // 2))
    if backend == "reference":
        check_mask(mask)
    else:
        q = torch.randn(1, 20, 2, 16, device=DEVICE)
        with pytest.raises(ValueError, match=r"^mask_mod: a lambda cannot be compiled into the Triton kernels; "
                                             r"define it with def \(the reference backend runs either\)$"):
            flashtile.attention(q, q, q, mask_mod=mask)
        with pytest.raises(ValueError, match=r"^mask_mod: the Triton kernels compile a function defined with def, "
                                             r"got partial \(the reference backend runs any callable\)$"):
            flashtile.attention(q, q, q, mask_mod=functools.partial(every_other_head_causal))


def test_plain_function_builds_its_block_mask_once():
    from flashtile.block_mask import _cached

    assert mask_mod(later_half_causal) is mask_mod(later_half_causal)
    q = torch.randn(1, 29, 2, 16, device=DEVICE)
    flashtile.attention(q, q, q, mask_mod=later_half_causal)
    misses = _cached.cache_info().misses
    flashtile.attention(q, q, q, mask_mod=later_half_causal)
    assert _cached.cache_info().misses == misses  # the second call reused the first's block mask


def test_block_mask_schedules_the_longest_lists_first():
    # Causal over 4 × 4 tiles: Q tile 3 visits 4 K/V tiles, tile 0 one; K/V tile 0 is seen
    # by 4 Q tiles. The kernels run programs in this order (the grid's tail stays short).
    bm = flashtile.create_block_mask(causal_mask(), seqlen_q=64, seqlen_k=64, block_m=16, block_n=16)
    assert bm.kv_order[0, 0].tolist() == [3, 2, 1, 0] and bm.q_order[0, 0].tolist() == [0, 1, 2, 3]
    # Per head: head 1 is a prefix mask (every Q tile sees K/V tile 0 only), so ties keep the
    # ascending order; each schedule is a permutation of the tiles.
    per_head = mask_mod(lambda b, h, q, kv: (h == 0) & (q >= kv) | (h == 1) & (kv < 16))
    bm = flashtile.create_block_mask(per_head, heads=2, seqlen_q=64, seqlen_k=64, block_m=16, block_n=16)
    assert bm.kv_order[0, 0].tolist() == [3, 2, 1, 0] and bm.kv_order[0, 1].tolist() == [0, 1, 2, 3]
    assert bm.q_order[0, 1].tolist() == [0, 1, 2, 3] and bm.kv_order.dtype == torch.int32


def late_keys_or_prefix(b, h, q_idx, kv_idx):
    # Rows see the keys from their own position on (an early Q tile sees the most, the
    # reverse of causal) on even heads of batch 0, a 16-key prefix on odd heads, causal
    # on batch 1: every schedule (forward, dQ, dK/dV) differs per batch and head.
    late = (q_idx <= kv_idx) & (h % 2 == 0) | (kv_idx < 16) & (h % 2 == 1)
    return (b == 0) & late | (b != 0) & (q_idx >= kv_idx)


@pytest.mark.parametrize("blocks", [(32, 16), (16, 32)], ids=["32x16", "16x32"])
def test_schedules_that_differ_per_batch_and_head_match_oracle(backend, blocks):
    bm = flashtile.create_block_mask(late_keys_or_prefix, 2, 4, 45, 70, DEVICE, *blocks)
    for order, count in ((bm.kv_order, bm.kv_count), (bm.q_order, bm.q_count)):
        assert torch.equal(order.sort(dim=-1).values, torch.arange(order.shape[-1]).expand_as(order).to(order))
        assert (count.gather(-1, order.long()).diff(dim=-1) <= 0).all()  # most visited first
    assert bm.q_order[0, 0].tolist() != sorted(bm.q_order[0, 0].tolist())  # not the identity
    check_mask(late_keys_or_prefix, seqlen_q=45, seqlen_k=70, blocks=blocks)


def test_block_mask_is_cached_and_sparse_documents_cost_less():
    docs = torch.arange(256, dtype=torch.int32) // 32  # 8 documents of 32
    mask = and_masks(causal_mask(), document_mask(docs))
    a = flashtile.create_block_mask(mask, seqlen_q=256, seqlen_k=256, block_m=16, block_n=16)
    b = flashtile.create_block_mask(mask, seqlen_q=256, seqlen_k=256, block_m=16, block_n=16)
    assert a is b
    dense_causal = flashtile.create_block_mask(causal_mask(), seqlen_q=256, seqlen_k=256, block_m=16, block_n=16)
    assert a.visited_fraction < dense_causal.visited_fraction / 4  # 8 small documents: far fewer tiles


def test_the_jitted_mask_is_shared_across_lengths():
    mask = causal_mask()
    assert mask.triton_fn() is mask.triton_fn()  # one constexpr function: no recompilation per length


def test_pictures():
    assert draw(and_masks(causal_mask(), sliding_window_mask(1)), 4, 4) == (
        "x . . .\nx x . .\n. x x .\n. . x x")
    assert draw(prefix_lm_mask(2), 3, 4) == "x x . .\nx x . .\nx x x ."


def test_mask_errors():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"^mask_mod: give either mask_mod or causal"):
        flashtile.attention(q, q, q, mask_mod=causal_mask(), causal=True)
    bm = flashtile.create_block_mask(causal_mask(), seqlen_q=16, seqlen_k=16, block_m=16, block_n=16)
    with pytest.raises(ValueError, match=r"^block_mask: built for"):
        flashtile.attention(q, q, q, mask_mod=bm.mask, block_mask=bm)
    with pytest.raises(ValueError, match=r"^window: expected an int >= 0"):
        sliding_window_mask(-1)
    with pytest.raises(TypeError, match=r"^document_ids: expected a 1-d int32"):
        document_mask(torch.zeros(4))
    with pytest.raises(ValueError, match=r"^block_m: expected a power of two"):
        flashtile.create_block_mask(causal_mask(), seqlen_q=16, seqlen_k=16, block_m=24)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MASKS))
def test_gpu_mask_mod(name, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    check_mask(MASKS[name](), seqlen_q=1000, seqlen_k=1000, heads_q=8, heads_kv=2, headdim=64)


def full_runs(bm, prefix: str) -> list[list[list[int]]]:
    """Per row of batch 0, head 0: the full tiles as runs [first, last], as the kernels walk them."""
    idx, partial, count, runs = (getattr(bm, f"{prefix}_{part}")[0, 0].tolist()
                                 for part in ("indices", "partial", "count", "runs"))
    rows = []
    for row_idx, lo, hi, row_runs in zip(idx, partial, count, runs):
        found, pos = [], lo
        while pos < hi:
            found.append([row_idx[pos], row_idx[pos] + row_runs[pos] - 1])
            pos += row_runs[pos]
        rows.append(found)
    return rows


def test_full_tiles_are_walked_in_runs(backend):
    # A row's full tiles, in runs of consecutive tile numbers (BlockMask.*_runs): one per row
    # for causal; one per full tile where every other key tile is full; two (the sink's tile
    # and the window's band) for sink tokens beside a window.
    causal = flashtile.create_block_mask(causal_mask(), 1, 1, 64, 64, DEVICE, 16, 16)
    assert full_runs(causal, "kv") == [[], [[0, 0]], [[0, 1]], [[0, 2]]]
    assert full_runs(causal, "q") == [[[1, 3]], [[2, 3]], [[3, 3]], []]
    strided = flashtile.create_block_mask(every_other_16_keys, 1, 1, 64, 80, DEVICE, 16, 16)
    assert full_runs(strided, "kv")[3] == [[0, 0], [2, 2], [4, 4]]
    sink = flashtile.create_block_mask(sink_16_and_window_56, 1, 1, 96, 96, DEVICE, 16, 16)
    assert full_runs(sink, "kv")[5] == [[0, 0], [3, 4]]
    # One run per row (*_full_range) is walked without the loop over runs; the sink mask's
    # dK/dV lists have one, its forward and dQ lists two.
    assert (causal.kv_full_range, causal.dq_full_range, causal.q_full_range) == (True, True, True)
    assert (sink.kv_full_range, sink.dq_full_range, sink.q_full_range) == (False, False, True)
    if backend != "triton":
        return
    # In each pass, a one-run mask through the loop over runs gives what its single range
    # gives, and the runs reach that kernel: runs claimed a tile too long there (where that
    # tile exists: the kernels do not bound-check full tiles) give a wrong result.
    q, k, v = (torch.randn(1, 96, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    one_run = flashtile.create_block_mask(causal_mask(), 1, 1, 96, 96, DEVICE, 16, 16)

    def result(block_mask, name):
        out = flashtile.attention(q, k, v, mask_mod=block_mask.mask, block_mask=block_mask)
        dq, dk, _ = torch.autograd.grad(out, (q, k, v), dout)
        return dict(out=out, dq=dq, dk=dk)[name]

    for prefix, name in (("kv", "out"), ("dq", "dq"), ("q", "dk")):
        run_loop = dataclasses.replace(one_run, **{f"{prefix}_full_range": False})
        assert max_error(result(run_loop, name), result(one_run, name)) < 1e-5, prefix
        runs, indices = getattr(sink, f"{prefix}_runs").clone(), getattr(sink, f"{prefix}_indices")
        longer = (runs > 0) & (indices + runs < indices.shape[-1])
        assert longer.any()
        runs[longer] += 1
        too_long = dataclasses.replace(sink, **{f"{prefix}_full_range": False, f"{prefix}_runs": runs})
        assert max_error(result(too_long, name), result(sink, name)) > 0.1, prefix


def test_generated_masks_trace_under_torch_compile():
    # A combined mask calls its parts through its own globals; torch.compile (FlexAttention
    # users compile their masks) must find them there.
    torch._dynamo.reset()
    ids = torch.arange(16, dtype=torch.int32) // 8
    mask = and_masks(causal_mask(), document_mask(ids))
    zero = torch.zeros((), dtype=torch.int64)

    def visible(q_idx, kv_idx):
        return mask(zero, zero, q_idx, kv_idx)

    q_idx, kv_idx = torch.arange(16).view(-1, 1), torch.arange(16).view(1, -1)
    compiled = torch.compile(visible, backend="eager", fullgraph=True)
    assert torch.equal(compiled(q_idx, kv_idx), visible(q_idx, kv_idx))
    assert visible(q_idx, kv_idx).sum() == 2 * (8 * 9 // 2)  # two causal documents of 8


@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch < 2.13: Dynamo cannot pass a frozen dataclass (the BlockMask) to a constant-result "
                           "function")
def test_prebuilt_block_mask_and_score_mod_under_torch_compile_fullgraph():
    # The block mask and score_mod cross into the ops as names (flashtile.op_names);
    # registering one is marked a constant result, so Dynamo runs it while tracing, and a
    # different block mask must recompile rather than reuse the first one's name.
    from flashtile.mask_mods import sliding_window_mask
    from flashtile.score_mods import softcap_score

    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    build = dict(seqlen_q=40, seqlen_k=40, block_m=16, block_n=16)
    causal = flashtile.create_block_mask(causal_mask(), **build)
    banded = flashtile.create_block_mask(and_masks(causal_mask(), sliding_window_mask(5)), **build)
    score = softcap_score(5.0)

    def f(q, k, v, block_mask):
        return flashtile.attention(q, k, v, block_mask=block_mask, score_mod=score)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for block_mask in (causal, banded, causal):
        eager, traced = f(q, k, v, block_mask), compiled(q, k, v, block_mask)
        assert max_error(traced, eager) == 0.0
        assert max_error(torch.autograd.grad(traced.sum(), q)[0], torch.autograd.grad(eager.sum(), q)[0]) == 0.0
    assert max_error(f(q, k, v, causal), f(q, k, v, banded)) > 0.1  # the two masks do differ
    torch._dynamo.reset()
