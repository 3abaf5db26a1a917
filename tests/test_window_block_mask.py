"""A sliding window run as a block mask of its band (api._band_block_mask): on sm_90 such calls
take the block-sparse Gluon kernels. On the CPU the same conversion is forced
(hopper.band_takes_block_sparse) and runs the Triton block-sparse kernels in the interpreter,
against the float64 oracle of the band itself."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import flashtile
from flashtile import api
from flashtile.block_mask import BlockMask
from flashtile.mask_mods import band_mask_mod, dense_mask
from flashtile.masks import Band, band_mask, normalize_window
from test_kernels import check_case

HAS_CUDA = torch.cuda.is_available()
ON_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
triton = pytest.importorskip("triton")
from flashtile.kernels import hopper  # noqa: E402  (imports Triton)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (17, 17), (113, 203), (203, 113), (5, 7)])
@pytest.mark.parametrize("left,right", [(0, 0), (3, 0), (5, None), (None, 2), (4, 9), (40, 0), (0, -3)])
def test_the_band_mask_mod_sees_what_the_band_sees(seqlen_q, seqlen_k, left, right):
    offset = seqlen_k - seqlen_q
    mask = band_mask_mod(None if left is None else offset - left, None if right is None else offset + right)
    got = dense_mask(mask, 1, 1, seqlen_q, seqlen_k)[0, 0]
    assert torch.equal(got, band_mask(seqlen_q, seqlen_k, Band(left, right)))


def test_one_band_mask_mod_per_band():
    assert band_mask_mod(-3, 0) is band_mask_mod(-3, 0)
    assert band_mask_mod(-3, 0) is not band_mask_mod(-3, 1)
    assert band_mask_mod(None, 5).name == "band_x_5" and band_mask_mod(-2, None).name == "band_m2_x"
    with pytest.raises(ValueError, match="at least one bound"):
        band_mask_mod(None, None)


# The tests below run the Triton kernels on CPU tensors, in the interpreter, which conftest sets
# only on CPU-only machines; on the H200 test_gpu_a_window_runs_on_the_block_sparse_gluon_kernels
# runs the conversion for real.
INTERPRETER_ONLY = "CPU tensors on the Triton backend run in the interpreter, set only on CPU-only machines"
needs_the_interpreter = pytest.mark.skipif(HAS_CUDA, reason=INTERPRETER_ONLY)


@pytest.fixture
def band_blocks(monkeypatch):
    """The conversion forced on (as on sm_90), the Triton backend, and the block masks it built."""
    if HAS_CUDA:
        pytest.skip(INTERPRETER_ONLY)
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setattr(hopper, "band_takes_block_sparse", lambda q, head_dim: True)
    monkeypatch.setattr(api, "_BAND_BLOCK_MASKS", {})
    built = []
    make = api._band_block_mask

    def recorded(*args, **kwargs):
        block = make(*args, **kwargs)
        built.append(block)
        return block

    monkeypatch.setattr(api, "_band_block_mask", recorded)
    return built


# batch, seqlen, hq, hkv, d, causal, window, layout: GQA, odd lengths and head dims, both layouts
CASES = [
    (1, 17, 2, 2, 16, True, (5, -1), "bshd"),
    (2, 40, 4, 2, 40, False, (7, 3), "bhsd"),
    (1, 37, 2, 1, 32, True, (0, -1), "bshd"),
    (1, 45, 2, 2, 16, False, (-1, 6), "bhsd"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"n{c[1]}-w{c[6][0]}_{c[6][1]}-{'causal' if c[5] else 'full'}"
                                             for c in CASES])
def test_a_window_run_as_its_block_mask_matches_the_oracle(band_blocks, case):
    batch, n, hq, hkv, d, causal, window, layout = case
    check_case(batch, n, n, hq, hkv, d, torch.float32, causal=causal, window=window, layout=layout, device="cpu")
    assert len(band_blocks) == 1 and isinstance(band_blocks[0], BlockMask)
    assert (band_blocks[0].seqlen_q, band_blocks[0].seqlen_k) == (n, n)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(37, 20), (20, 45)])
def test_queries_apart_from_the_keys_keep_the_band_path(band_blocks, seqlen_q, seqlen_k):
    # (a KV-cache call: its offset changes from step to step; a mask per offset would recompile)
    check_case(1, seqlen_q, seqlen_k, 2, 1, 16, torch.float32, causal=True, window=(4, -1), device="cpu")
    assert band_blocks == [None]


def test_the_band_block_mask_is_built_once_per_band_and_shape(band_blocks):
    q, k, v = (torch.randn(1, 24, 2, 16, requires_grad=True) for _ in range(3))
    for _ in range(2):
        flashtile.attention(q, k, v, causal=True, window_size=(6, -1))
    flashtile.attention(q, k, v, causal=True, window_size=(7, -1))
    first, again, other = band_blocks
    assert first is again and other is not first
    # the interpreter's 16 x 16 tiles: a 24-long band of 7 keys holds empty, partial and full tiles
    assert (first.block_m, first.block_n) == (16, 16)


def test_without_a_backward_to_follow_a_window_keeps_the_band_path(band_blocks):
    # inference: prompt and cache lengths change from call to call, and each new length would
    # build a block mask (training repeats its lengths, and its backward gains the most)
    q, k, v = (torch.randn(1, 24, 2, 16, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        flashtile.attention(q, k, v, causal=True, window_size=(6, -1))
    flashtile.attention(q.detach(), k.detach(), v.detach(), causal=True, window_size=(6, -1))
    assert band_blocks == [None, None]


def test_under_torch_compile_a_window_keeps_the_band_path(band_blocks, monkeypatch):
    # (building a block mask is host work a compiled graph cannot hold)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v = (torch.randn(1, 24, 2, 16, requires_grad=True) for _ in range(3))
    flashtile.attention(q, k, v, causal=True, window_size=(6, -1))
    assert band_blocks == [None]


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (5, 5), (5, 9), (9, 5)])
def test_a_bound_that_hides_no_key_is_dropped(seqlen_q, seqlen_k):
    for left, right in itertools.product([None, 0, 1, 3, 4, 7, 8, 9, 20], [None, 0, 3, 4, 5, 8, 20]):
        band = Band(left, right)
        clamped = band.clamped(seqlen_q, seqlen_k)
        assert torch.equal(band_mask(seqlen_q, seqlen_k, clamped), band_mask(seqlen_q, seqlen_k, band))
        if left is not None and left >= seqlen_k - 1:
            assert clamped.left is None
        if right is not None and right >= seqlen_q - 1:
            assert clamped.right is None
    assert Band(2, 0).clamped(9, 9) == Band(2, 0)


def test_a_window_wider_than_the_sequence_is_causal_and_builds_nothing(band_blocks):
    q, k, v = (torch.randn(1, 24, 2, 16, requires_grad=True) for _ in range(3))
    wide = flashtile.attention(q, k, v, causal=True, window_size=(23, -1))
    causal = flashtile.attention(q, k, v, causal=True)
    assert torch.equal(wide, causal)
    assert band_blocks == [None, None]


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(causal=True, window_size=(4, -1), softcap=5.0),
                                     dict(window_size=(4, 4), dropout_p=0.1),
                                     dict(window_size=(4, 4), alibi_slopes=torch.ones(2)),
                                     dict(causal=True, window_size=(4, -1), bias=torch.zeros(1, 1, 1, 24))],
                         ids=["full", "causal", "softcap", "dropout", "alibi", "bias"])
def test_what_is_not_a_plain_window_keeps_the_kernels_band_path(band_blocks, options):
    q, k, v = (torch.randn(1, 24, 2, 16, requires_grad=True) for _ in range(3))
    flashtile.attention(q, k, v, **options)
    assert band_blocks and all(block is None for block in band_blocks)


@needs_the_interpreter
def test_without_the_gluon_kernels_a_window_keeps_the_band_path(monkeypatch):
    # the CPU here: band_takes_block_sparse says no (no sm_90), so nothing is built
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setattr(api, "_BAND_BLOCK_MASKS", {})
    q, k, v = (torch.randn(1, 24, 2, 16, requires_grad=True) for _ in range(3))
    flashtile.attention(q, k, v, causal=True, window_size=(6, -1))
    assert api._BAND_BLOCK_MASKS == {}
    assert not hopper.band_takes_block_sparse(q, 16)


def test_band_takes_block_sparse_follows_the_switches_and_head_dims(monkeypatch):
    monkeypatch.setattr(hopper, "_device_runs_them", lambda q: True)
    q = torch.empty(1, 1, 1, 128, dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHTILE_GLUON", "auto")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "auto")
    assert hopper.band_takes_block_sparse(q, 128) and hopper.band_takes_block_sparse(q, 64)
    assert hopper.band_takes_block_sparse(q, 96)  # runs the d128 kernels over zero columns
    assert hopper.band_takes_block_sparse(q, 40)
    assert not hopper.band_takes_block_sparse(q, 256)  # no block-sparse Gluon backward at d256
    assert not hopper.band_takes_block_sparse(q, 80) and not hopper.band_takes_block_sparse(q, 16)  # not timed
    assert not hopper.band_takes_block_sparse(q.float(), 128)
    for switch in ("FLASHTILE_GLUON", "FLASHTILE_GLUON_BWD"):
        monkeypatch.setenv(switch, "0")
        assert not hopper.band_takes_block_sparse(q, 128)
        monkeypatch.setenv(switch, "auto")
    monkeypatch.setattr(hopper, "BAND_AS_BLOCK_MASK", False)
    assert not hopper.band_takes_block_sparse(q, 128)


GPU_CASES = [
    (torch.bfloat16, d, sq_sk, causal, window)
    for d, sq_sk, (causal, window) in itertools.product(
        [64, 128, 96], [(17, 17), (113, 113), (203, 113), (1023, 1023), (2048, 2048)],
        [(True, (256, -1)), (False, (100, 37)), (True, (64, -1))])
] + [(torch.float16, d, (1023, 1023), True, (256, -1)) for d in (64, 128)]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the block-sparse Gluon kernels are built for sm_90")
@pytest.mark.parametrize("dtype,headdim,seqlens,causal,window", GPU_CASES,
                         ids=[f"{str(c[0])[6:]}-d{c[1]}-q{c[2][0]}k{c[2][1]}-{'causal' if c[3] else 'full'}-"
                              f"w{c[4][0]}_{c[4][1]}" for c in GPU_CASES])
def test_gpu_a_window_runs_on_the_block_sparse_gluon_kernels(monkeypatch, dtype, headdim, seqlens, causal, window):
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    listed = []
    for name in ("_listed_forward", "_listed_backward"):
        run = getattr(hopper, name)

        def counted(*args, _run=run, _name=name, **kwargs):
            listed.append(_name)
            return _run(*args, **kwargs)

        monkeypatch.setattr(hopper, name, counted)
    sq, sk = seqlens
    index = GPU_CASES.index((dtype, headdim, seqlens, causal, window))
    heads_q, heads_kv = [(8, 2), (4, 4), (8, 1)][index % 3]
    check_case(2 if sq * sk <= 1024 * 1024 else 1, sq, sk, heads_q, heads_kv, headdim, dtype, causal=causal,
               window=window, layout=["bshd", "bhsd"][(index // 3) % 2], device="cuda")
    # queries apart from the keys keep the Triton kernels' band path (see _band_block_mask), and
    # so does a window as wide as the sequence (Band.clamped: plain causal or full attention); the
    # forward takes the block-sparse Gluon kernel where auto takes Gluon at its head dim and
    # length (d64 below 4k keys keeps the Triton block-sparse forward)
    band = normalize_window(causal, window).clamped(sq, sk)
    expected = ["_listed_backward"]
    if hopper.measured_faster(headdim, sk, backward=False):
        expected.insert(0, "_listed_forward")
    assert listed == (expected if sq == sk and not band.is_full and band != Band(None, 0) else [])
    assert hopper._FAILED == set(), "a Gluon kernel failed to build and fell back to Triton"


BAND_SHAPES = [(1, 1), (17, 17), (113, 203), (203, 113), (40, 40), (128, 128), (300, 257)]


@pytest.mark.parametrize("seqlen_q,seqlen_k", BAND_SHAPES)
@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 64), (128, 64)])
def test_a_band_s_tiles_in_closed_form_are_the_mask_s_own(seqlen_q, seqlen_k, tiles):
    # _classify_band must give, tile for tile, what evaluating the mask gives: the same kinds
    # mean the same lists, so the kernels walk the same tiles either way
    from flashtile.block_mask import _classify

    bands = [(None, 0), (-5, 0), (-40, 7), (0, None), (3, 90), (-1, -1), (-300, 300), (10, 12), (-17, None),
             (5, 2), (-3, -8)]  # (the last two see nothing: every tile empty)
    for lower, upper in bands:
        closed = band_mask_mod(lower, upper)
        evaluated = dataclasses.replace(closed, band=None)
        for batch, heads in ((1, 1), (2, 3)):
            got = _classify(closed, batch, heads, seqlen_q, seqlen_k, *tiles, "cpu")
            want = _classify(evaluated, batch, heads, seqlen_q, seqlen_k, *tiles, "cpu")
            assert torch.equal(got, want), (lower, upper, batch, heads)


def test_the_library_bands_carry_their_closed_form():
    from flashtile.mask_mods import causal_mask, sliding_window_mask

    for mask, band in ((causal_mask(), (None, 0)), (sliding_window_mask(6), (-6, 6)), (band_mask_mod(-3, 2), (-3, 2))):
        assert mask.band == band
        plain = dataclasses.replace(mask, band=None)
        built = flashtile.create_block_mask(mask, 1, 1, 77, 77, "cpu", 16, 32)
        evaluated = flashtile.create_block_mask(plain, 1, 1, 77, 77, "cpu", 16, 32)
        for kernel in ("fwd", "dq", "dkdv"):
            (lists, strides, one_run), (want, want_strides, want_one_run) = built.lists(kernel), evaluated.lists(kernel)
            assert strides == want_strides and one_run == want_one_run
            for a, b in zip(lists, want):
                assert torch.equal(a, b), kernel
