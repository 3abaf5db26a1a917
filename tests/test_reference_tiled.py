"""The public API on the PyTorch reference backend against the float64 oracle.

Forward, LSE and all three gradients, judged by the numerical contract (see
helpers.check_against_oracle). Shapes are a curated list, not a full product: odd
lengths that straddle tiles (17, 113, 203), q ≠ k lengths both ways, head dims
16…128, GQA/MQA, every mask option and both layouts with varied strides.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashtile
from flashtile.masks import normalize_window
from flashtile.reference import naive_attention, tiled_attention_backward, tiled_attention_forward
from flashtile.testing import max_error

from helpers import check_against_oracle, make_qkv, random_slopes

pytestmark = pytest.mark.usefixtures("reference_backend")

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


def case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, dtype=f32, layout="bshd", storage=None, **options):
    """One curated problem; ``alibi="heads"|"batch_heads"`` picks the slope shape."""
    name = f"b{batch}-sq{seqlen_q}-sk{seqlen_k}-h{heads_q}:{heads_kv}-d{headdim}-{str(dtype)[6:]}-{layout}"
    if storage:
        name += f"-{storage}"
    for key, value in options.items():
        name += f"-{key}={value}"
    return pytest.param(dict(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
                             headdim=headdim, dtype=dtype, layout=layout, storage=storage), options, id=name)


CASES = [
    # seqlens {1, 17, 113, 203}, head dims {16, 40, 64, 80, 128}
    case(2, 1, 1, 2, 2, 16),
    case(2, 17, 17, 2, 2, 40, causal=True),
    case(1, 113, 113, 4, 2, 64, f16, causal=True),
    case(1, 203, 203, 2, 1, 80, f32, "bhsd", "transposed", window_size=(16, 4)),
    case(1, 203, 203, 2, 2, 128, f16, "bhsd", "contiguous"),
    # seqlen_q != seqlen_k, both ways (bottom-right causal, fully masked rows)
    case(2, 17, 113, 4, 1, 128, causal=True),
    case(2, 113, 17, 4, 2, 64, f16, "bhsd", "transposed", causal=True),
    case(1, 1, 203, 4, 4, 64, causal=True),
    case(1, 203, 1, 2, 2, 16, causal=True),
    case(1, 113, 203, 2, 2, 80, f16, "bshd", "transposed", causal=True, window_size=(8, 0)),
    # windows
    case(1, 113, 113, 2, 2, 40, window_size=(8, 0)),
    case(2, 17, 113, 2, 1, 64, f16, window_size=(16, 4)),
    case(1, 113, 17, 2, 2, 16, f32, "bhsd", "contiguous", window_size=(0, 0)),
    case(1, 203, 113, 2, 2, 64, window_size=(-1, 8)),
    # softcap and ALiBi
    case(2, 113, 113, 4, 2, 64, softcap=2.0),
    case(1, 17, 203, 2, 2, 128, f16, "bhsd", "transposed", causal=True, softcap=1.5),
    case(2, 113, 113, 4, 4, 40, causal=True, alibi="heads"),
    case(2, 17, 113, 4, 2, 80, f16, alibi="batch_heads"),
    case(1, 203, 17, 4, 1, 64, f32, "bhsd", "transposed", alibi="heads", window_size=(16, 4)),
    # everything at once
    case(2, 113, 203, 4, 2, 64, f32, "bhsd", "contiguous", causal=True, window_size=(16, 4), softcap=2.0,
         alibi="batch_heads"),
    case(1, 203, 113, 4, 1, 80, f16, "bshd", "contiguous", causal=True, softcap=2.0, alibi="heads"),
    # bfloat16 (reference only: Triton's interpreter cannot do bf16 arithmetic)
    case(1, 113, 113, 4, 2, 64, bf16, causal=True),
    case(2, 17, 203, 2, 2, 128, bf16, "bhsd", "transposed", window_size=(16, 4), softcap=2.0),
    case(1, 203, 113, 4, 4, 40, bf16, causal=True, alibi="heads"),
    # custom scale
    case(1, 113, 113, 2, 2, 64, softmax_scale=0.3),
]


def resolve(shape, options):
    """Turn the case's 'alibi' marker into slopes; returns the flashtile options."""
    options = dict(options)
    alibi = options.pop("alibi", None)
    if alibi == "heads":
        options["alibi_slopes"] = random_slopes(shape["heads_q"])
    elif alibi == "batch_heads":
        options["alibi_slopes"] = random_slopes(shape["batch"], shape["heads_q"])
    return options


@pytest.mark.parametrize("shape, options", CASES)
def test_attention_matches_oracle(shape, options):
    options = resolve(shape, options)
    layout = shape["layout"]
    q, k, v = make_qkv(shape["batch"], shape["seqlen_q"], shape["seqlen_k"], shape["heads_q"], shape["heads_kv"],
                       shape["headdim"], dtype=shape["dtype"], layout=layout, storage=shape["storage"])

    def fn(q, k, v):
        return flashtile.attention(q, k, v, layout=layout, return_lse=True, **options)

    check_against_oracle(fn, q, k, v, layout=layout, **options)


@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("lse_only", [False, True], ids=["out+lse", "lse_only"])
def test_gradient_through_lse(dtype, lse_only):
    # Rows 0..89 of a causal 113×23 problem see no key: their LSE is -inf and the
    # loss must leave them out; the others carry a gradient into the LSE.
    slopes = random_slopes(4)
    options = dict(causal=True, softcap=2.5, alibi_slopes=slopes)
    q, k, v = make_qkv(2, 113, 23, 4, 2, 64, dtype=dtype)

    def fn(q, k, v):
        return flashtile.attention(q, k, v, return_lse=True, **options)

    check_against_oracle(fn, q, k, v, lse_grad=True, lse_only=lse_only, **options)


def test_float64_is_exact_on_the_reference():
    q, k, v = make_qkv(1, 113, 203, 4, 2, 64, dtype=torch.float64)

    def fn(q, k, v):
        return flashtile.attention(q, k, v, causal=True, return_lse=True)

    results = check_against_oracle(fn, q, k, v, causal=True)
    for name in ("out", "lse", "dq", "dk", "dv"):
        err = max_error(results[name], results["oracle"][name])
        assert err < 1e-12, f"{name}: float64 reference differs from the float64 oracle by {err:.3e}"


def test_fully_masked_rows_through_the_api():
    q, k, v = make_qkv(1, 17, 5, 2, 2, 16)
    out, lse = flashtile.attention(q, k, v, causal=True, return_lse=True)
    (out * torch.randn_like(out)).sum().backward()
    empty = slice(0, 12)  # query i sees keys <= i - 12
    assert (out[:, empty] == 0).all(), "rows with no visible key must output 0"
    assert torch.isneginf(lse[:, :, empty]).all(), "rows with no visible key must have LSE = -inf"
    assert torch.isfinite(lse[:, :, 12:]).all()
    assert (q.grad[:, empty] == 0).all(), "rows with no visible key must have dq = 0"
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        assert torch.isfinite(t.grad).all(), f"{name}: not finite"


# ---------------------------------------------------------------------------
# Block sizes change the order of summation only.

BLOCKS = [(16, 16), (32, 32), (64, 64), (16, 64), (64, 16), (32, 128), (128, 32)]


def tiled_fn(softmax_scale, band, softcap, alibi_slopes, BLOCK_M, BLOCK_N):
    """``fn(q, k, v) -> (out, lse)`` on (B, H, S, D) tensors: the tiled pair with chosen
    block sizes, differentiable (the LSE's gradient included)."""

    class Tiled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = tiled_attention_forward(q, k, v, softmax_scale, band, softcap, alibi_slopes,
                                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
            ctx.save_for_backward(q, k, v, out, lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v, out, lse = ctx.saved_tensors
            return tiled_attention_backward(dout, q, k, v, out, lse, softmax_scale, band, softcap, alibi_slopes,
                                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, dlse=dlse)

    return Tiled.apply


@pytest.mark.parametrize("dtype", [f32, f16], ids=["f32", "f16"])
def test_block_sizes_do_not_change_the_result(dtype):
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim = 2, 113, 203, 4, 2, 64
    slopes = random_slopes(heads_q)
    options = dict(causal=True, window_size=(48, 4), softcap=2.0, alibi_slopes=slopes)
    band = normalize_window(True, (48, 4))
    scale = headdim ** -0.5
    # The tiled functions take (batch, heads, seqlen, headdim) with any strides.
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, dtype=dtype, layout="bhsd",
                       requires_grad=False)
    dout = torch.randn(q.shape, dtype=dtype)

    results = {}
    for block_m, block_n in BLOCKS:
        out, lse = tiled_attention_forward(q, k, v, scale, band, 2.0, slopes, BLOCK_M=block_m, BLOCK_N=block_n)
        grads = tiled_attention_backward(dout, q, k, v, out, lse, scale, band, 2.0, slopes,
                                         BLOCK_M=block_m, BLOCK_N=block_n)
        results[block_m, block_n] = (out, lse, *grads)

    fn = tiled_fn(scale, band, 2.0, slopes, BLOCK_M=16, BLOCK_N=64)
    check_against_oracle(fn, q, k, v, layout="bhsd", lse_grad=True, **options)

    # Same inputs, different tiles: differences are float32 rounding in the
    # accumulators (then one rounding to the input dtype), never more.
    reference = results[64, 64]
    eps32 = torch.finfo(torch.float32).eps
    for blocks, result in results.items():
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), result, reference):
            assert a.shape == b.shape and a.dtype == b.dtype, f"{name} with blocks {blocks}: shape/dtype changed"
            magnitude = max(b[torch.isfinite(b)].abs().max().item(), 1.0)
            # A few float32 ulps of reordering, plus one rounding step of the output dtype.
            limit = (16 * eps32 + 2 * torch.finfo(a.dtype).eps) * magnitude
            err = max_error(a, b)
            assert err <= limit, f"{name}: blocks {blocks} differ from 64×64 by {err:.3e} (> {limit:.3e})"


def test_tiled_forward_writes_into_a_given_out_view():
    # ops.attention_forward hands a transposed view of a (B, S, H, D) buffer as `out`.
    q, k, v = make_qkv(1, 40, 40, 2, 2, 16, layout="bhsd", requires_grad=False)
    buffer = torch.full((1, 40, 2, 16), float("nan"))
    out, _ = tiled_attention_forward(q, k, v, 0.25, normalize_window(True, (-1, -1)), out=buffer.transpose(1, 2),
                                     BLOCK_M=16, BLOCK_N=16)
    assert out.data_ptr() == buffer.data_ptr(), "tiled forward did not write into the given out"
    assert not torch.isnan(buffer).any(), "tiled forward left part of the out buffer unwritten"
    expected = flashtile.naive_attention(q, k, v, causal=True, softmax_scale=0.25, layout="bhsd")
    assert max_error(buffer.transpose(1, 2), expected) < 1e-5


# ---------------------------------------------------------------------------
# Random small problems with random tiles: masks at every tile boundary.


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    seqlen_q=st.integers(1, 70),
    seqlen_k=st.integers(1, 70),
    group=st.sampled_from([(1, 1), (2, 1), (3, 3), (4, 2)]),
    headdim=st.sampled_from([8, 16, 24]),
    blocks=st.tuples(st.sampled_from([16, 32, 64]), st.sampled_from([16, 32, 64])),
    causal=st.booleans(),
    window=st.tuples(st.integers(-1, 20), st.integers(-1, 20)),
    softcap=st.sampled_from([0.0, 1.5]),
    alibi=st.booleans(),
    dtype=st.sampled_from([f32, f16]),
    torch_seed=st.integers(0, 2**31 - 1),
)
def test_random_problems_random_tiles(seqlen_q, seqlen_k, group, headdim, blocks, causal, window, softcap, alibi,
                                      dtype, torch_seed):
    torch.manual_seed(torch_seed)
    heads_q, heads_kv = group
    slopes = random_slopes(heads_q) if alibi else None
    band = normalize_window(causal, window)
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, heads_q, heads_kv, headdim, dtype=dtype, layout="bhsd", scale=1.5)
    fn = tiled_fn(headdim ** -0.5, band, softcap, slopes, *blocks)
    check_against_oracle(fn, q, k, v, layout="bhsd", lse_grad=True, causal=causal, window_size=window,
                         softcap=softcap, alibi_slopes=slopes,
                         label=f"blocks {blocks}, causal={causal}, window={window}")


@pytest.mark.parametrize("bias_shape", [(2, 4, 37, 29), (37, 29), (2, 1, 1, 29), (1, 4, 37, 1), (4, 1, 29)],
                         ids=str)
def test_tiled_additive_bias_and_its_gradient(bias_shape):
    # The tiled algorithm takes the oracle's additive bias (broadcast as torch does) and
    # accumulates its gradient tile by tile; float64 so the comparison is exact to rounding.
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, headdim = 2, 4, 2, 37, 29, 16
    q = torch.randn(batch, heads_q, seqlen_q, headdim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(batch, heads_kv, seqlen_k, headdim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(batch, heads_kv, seqlen_k, headdim, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(bias_shape, dtype=torch.float64, requires_grad=True)
    ref = naive_attention(q, k, v, causal=True, softcap=3.0, bias=bias, layout="bhsd")
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v, bias), dout)

    band = normalize_window(True, (-1, -1))
    scale = headdim**-0.5
    out, lse = tiled_attention_forward(q.detach(), k.detach(), v.detach(), scale, band, 3.0, None, 16, 8,
                                       bias=bias.detach())
    dbias = torch.zeros_like(bias)
    grads = tiled_attention_backward(dout, q.detach(), k.detach(), v.detach(), out, lse, scale, band, 3.0, None, 16, 8,
                                     bias=bias.detach(), dbias=dbias)
    assert max_error(out, ref) < 1e-12
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), (*grads, dbias), ref_grads):
        assert max_error(g, r) < 1e-12, name


# -- the tile a call runs, and the tiles a block mask lets it skip ----------------------------

def test_default_tile_keeps_a_tile_of_scores_within_the_budget():
    from flashtile.reference.tiled import TILE_SCORES, default_tile

    assert default_tile(1, 8) == 256 and default_tile(2, 16) == 128 and default_tile(4, 32) == 64
    assert default_tile(64, 64) == 64  # never below the smallest tile, whatever the budget says
    for batch, heads in ((1, 1), (1, 8), (2, 16), (3, 7), (4, 32)):
        block = default_tile(batch, heads)
        assert batch * heads * block * block <= TILE_SCORES or block == 64


def _assert_masked_attention_matches_oracle(out, dout, leaves, visible, tolerance):
    """``out`` (and the leaves' gradients after out.backward(dout)) against the float64 oracle of
    the same leaves with ``visible`` (B, H, Sq, Sk) as a −inf bias."""
    bias = torch.zeros(visible.shape, dtype=torch.float64).masked_fill(~visible, float("-inf"))
    fresh = [t.detach().requires_grad_() for t in leaves]
    expected = naive_attention(*fresh, bias=bias, upcast=True)
    expected.backward(dout)
    torch.testing.assert_close(out.detach(), expected.detach(), rtol=tolerance, atol=tolerance)
    for got, want in zip(leaves, fresh):
        torch.testing.assert_close(got.grad, want.grad, rtol=tolerance, atol=tolerance)


def head_one_also_sees_40_keys(b, h, q_idx, kv_idx):
    return (h == 1) & (kv_idx < 40)


def test_tile_kinds_hold_for_every_batch_entry_and_head():
    # tile_kinds aggregates the lists over (batch, head): a tile is skipped only if no pair visits
    # it, left unmasked only if every pair sees all of it. Brute force on the element mask.
    from flashtile.mask_mods import dense_mask, document_mask, or_masks

    seqlen = 203
    ids = (torch.arange(seqlen, dtype=torch.int32) * 3 // seqlen).to(torch.int32)
    mask = or_masks(document_mask(ids), head_one_also_sees_40_keys)  # kinds that differ per head
    bm = flashtile.create_block_mask(mask, 1, 2, seqlen, seqlen, block_m=32, block_n=16, backward_block_n=16)
    visible = dense_mask(mask, 1, 2, seqlen, seqlen)
    cases = [("fwd", 1, 1), ("dq", 1, 1), ("fwd", 2, 3), ("dq", 4, 2), ("fwd", 7, 13)]  # (7 x 13: one tile)
    for kernel, rows, cols in cases:
        block_m, block_n = (bm.block_m, bm.block_n) if kernel == "fwd" else bm.backward_blocks
        block_m, block_n = block_m * rows, block_n * cols
        kinds = bm.tile_kinds(kernel, rows, cols)
        seen_kinds = set()
        for m, row in enumerate(kinds):
            for n, kind in enumerate(row):
                tile = visible[..., m * block_m:(m + 1) * block_m, n * block_n:(n + 1) * block_n]
                hangs = (m + 1) * block_m > seqlen or (n + 1) * block_n > seqlen  # never full (block_mask.py)
                expected = 0 if not tile.any() else 1 if tile.all() and not hangs else 2
                assert kind == expected, (kernel, rows, cols, m, n)
                seen_kinds.add(kind)
        if (rows, cols) == (1, 1):  # (the coarse tilings may have no full tile; 7 x 13 is one partial tile)
            assert seen_kinds == {0, 1, 2}
        elif rows * cols > 50:
            assert seen_kinds == {2}


@pytest.mark.parametrize("document", [256, 192], ids=["borders-on-tiles", "borders-inside-tiles"])
def test_the_reference_skips_the_empty_tiles_of_a_block_mask_and_masks_only_the_partial_ones(monkeypatch, document):
    # Each visited tile is one _score_tile call, with the mask only where the tile is partial;
    # the answer is the oracle's either way, forward and gradients. The reference runs whole
    # tiles of the block mask's, near default_tile (here 8 × 4 of its 32 × 64).
    from flashtile.mask_mods import dense_mask, document_mask
    from flashtile.reference import tiled

    seqlen, tiles = 1024, []
    score_tile = tiled._score_tile

    def counted(*args, **kwargs):
        tiles.append(args[11] is not None)  # (the tile's mask argument)
        return score_tile(*args, **kwargs)

    monkeypatch.setattr(tiled, "_score_tile", counted)
    ids = (torch.arange(seqlen, dtype=torch.int32) // document).to(torch.int32)
    mask = document_mask(ids)
    bm = flashtile.create_block_mask(mask, 1, 1, seqlen, seqlen, block_m=32, block_n=64, backward_block_n=64)
    called, block_m, block_n, kinds = tiled._call_tiles(None, bm, "fwd", None, None, 1, 2)
    assert called is mask and (block_m, block_n) == (tiled.default_tile(1, 2),) * 2 == (256, 256)
    assert kinds == bm.tile_kinds("fwd", 8, 4) and tiled._call_tiles(None, bm, "dq", None, None, 1, 2)[3] == kinds
    visited, partial = (sum(sum(kind >= k for kind in row) for row in kinds) for k in (1, 2))
    assert visited < len(kinds) ** 2  # documents leave tiles empty

    q, k, v = (torch.randn(1, seqlen, 2, 32, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm)
    assert (len(tiles), sum(tiles)) == (visited, partial)
    tiles.clear()
    dout = torch.randn_like(out)
    out.backward(dout)
    assert (len(tiles), sum(tiles)) == (2 * visited, 2 * partial)  # the dK/dV pass and the dQ pass
    if document == 256:
        assert (visited, partial) == (4, 0)  # one tile per document: the mask is never evaluated

    _assert_masked_attention_matches_oracle(out, dout, (q, k, v), dense_mask(mask, 1, 1, seqlen, seqlen), 1e-10)


def odd_heads_see_everything(b, h, q_idx, kv_idx):
    return h % 2 == 1


def batch_one_sees_the_first_half(b, h, q_idx, kv_idx):
    return (b == 1) & (kv_idx * 2 < q_idx + 1)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_block_masks_on_the_reference_match_the_oracle(data):
    # Random masks, tilings and (batch, head) counts through the reference's block-mask walk
    # (skipped, unmasked and masked tiles, coarsened to its own tile size, tiles hanging past
    # the ends): forward and gradients against the float64 oracle on the dense mask.
    from flashtile.mask_mods import (and_masks, causal_mask, chunked_mask, dense_mask, document_mask, mask_mod,
                                     or_masks, prefix_lm_mask, sliding_window_mask)

    seqlen_q = data.draw(st.integers(1, 300), label="seqlen_q")
    seqlen_k = data.draw(st.sampled_from([seqlen_q, data.draw(st.integers(1, 300), label="other")]), label="seqlen_k")
    batch, heads = data.draw(st.integers(1, 2), label="batch"), data.draw(st.sampled_from([1, 2, 4]), label="heads")
    length = max(seqlen_q, seqlen_k)
    documents = data.draw(st.integers(1, 6), label="documents")
    ids = (torch.arange(length, dtype=torch.int32) * documents // length).to(torch.int32)
    pieces = {
        "causal": causal_mask(), "window": sliding_window_mask(data.draw(st.integers(0, 80), label="window")),
        "prefix": prefix_lm_mask(data.draw(st.integers(0, 100), label="prefix")),
        "chunked": chunked_mask(data.draw(st.integers(1, 90), label="chunk")), "documents": document_mask(ids),
        "odd-heads": mask_mod(odd_heads_see_everything), "batch-one": mask_mod(batch_one_sees_the_first_half),
    }
    names = data.draw(st.lists(st.sampled_from(sorted(pieces)), min_size=1, max_size=3, unique=True), label="masks")
    if "documents" in names and seqlen_q != seqlen_k:
        names.remove("documents")  # (document ids index queries and keys alike)
    if not names:
        names = ["causal"]
    combine = data.draw(st.sampled_from([and_masks, or_masks]), label="combine")
    mask = combine(*(pieces[name] for name in names))
    block_m = data.draw(st.sampled_from([16, 32, 64, 128]), label="block_m")
    block_n = data.draw(st.sampled_from([16, 32, 64]), label="block_n")
    bm = flashtile.create_block_mask(mask, batch, heads, seqlen_q, seqlen_k, block_m=block_m, block_n=block_n,
                                     backward_block_n=data.draw(st.sampled_from([16, 32]), label="backward_block_n"))
    q = torch.randn(batch, seqlen_q, heads, 16, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(batch, seqlen_k, heads, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm)
    dout = torch.randn_like(out)
    out.backward(dout)

    _assert_masked_attention_matches_oracle(out, dout, (q, k, v), dense_mask(mask, batch, heads, seqlen_q, seqlen_k),
                                            1e-9)
