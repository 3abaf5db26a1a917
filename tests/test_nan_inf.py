"""NaN and Inf inputs: what propagates where, as docs/errors.md ("NaN and Inf inputs") says.

Each test plants one non-finite value into otherwise random inputs and compares with
the same call on the clean inputs. "Unaffected" means bit-identical to the clean run,
not merely finite.

On a CPU machine "triton" runs the kernels in Triton's interpreter (16×16 tiles); the
reference backend uses 64×64 tiles; GPU configs go up to 128. The tests only claim
what holds for every tile size up to 128.
"""

from __future__ import annotations

import pytest
import torch

import flashtile
from flashtile.masks import band_mask, normalize_window

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
BACKENDS = ["reference", "triton"]
# NumPy (under Triton's interpreter) warns about the very NaNs these tests plant.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
NAN, INF = float("nan"), float("inf")

@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def _inputs(seqlen_q=40, seqlen_k=40, heads_q=2, heads_kv=1, headdim=16, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, headdim, generator=g)
    k = torch.randn(batch, seqlen_k, heads_kv, headdim, generator=g)
    v = torch.randn(batch, seqlen_k, heads_kv, headdim, generator=g)
    return [t.to(DEVICE) for t in (q, k, v)]


def _run(q, k, v, grad=False, **options):
    """out (B, Sq, Hq, D), lse (B, Hq, Sq) and, with ``grad``, (dq, dk, dv) for a fixed dout."""
    leaves = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    out, lse = flashtile.attention(*leaves, return_lse=True, **options)
    if not grad:
        return out.detach(), lse.detach(), None
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    return out.detach(), lse.detach(), torch.autograd.grad(out, leaves, dout)


def _rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Bool per index of ``dim``: True where any element is non-finite."""
    bad = ~torch.isfinite(t)
    return bad.transpose(0, dim).flatten(1).any(1) if t.dim() > 1 else bad


def _visible(seqlen_q, seqlen_k, causal, window):
    return band_mask(seqlen_q, seqlen_k, normalize_window(causal, window), DEVICE)  # (Sq, Sk) True = attends


# ---------------------------------------------------------------------------
# A non-finite query row.


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_query_row_leaves_every_other_row_unchanged(backend, value, causal):
    q, k, v = _inputs()
    clean = _run(q, k, v, causal=causal)
    q[1, 20, 0, 3] = value  # batch 1, row 20, head 0
    out, lse, _ = _run(q, k, v, causal=causal)
    other = torch.ones(out.shape[:3], dtype=torch.bool, device=DEVICE)
    other[1, 20, 0] = False
    assert torch.equal(out[other], clean[0][other]), "a non-finite query changed other query rows"
    other_lse = other.transpose(1, 2)
    assert torch.equal(lse[other_lse], clean[1][other_lse]), "a non-finite query changed other rows' LSE"


def test_nan_query_row_is_nan(backend, request):
    q, k, v = _inputs()
    q[1, 20, 0, 3] = NAN
    out, _, _ = _run(q, k, v)
    assert torch.isnan(out[1, 20, 0]).all(), f"out row of a NaN query: {out[1, 20, 0, :4].tolist()}, expected NaN"


def test_nan_query_row_has_nan_lse(backend):
    q, k, v = _inputs()
    q[1, 20, 0, 3] = NAN
    _, lse, _ = _run(q, k, v)
    assert torch.isnan(lse[1, 0, 20]), f"LSE of a NaN query row: {lse[1, 0, 20].item()}, expected NaN"


def test_nan_query_row_gradients(backend):
    # dq of the other rows is unchanged; dq of the NaN row is NaN (both backends: the
    # backward recomputes P = exp(S - LSE) from the NaN scores).
    q, k, v = _inputs()
    *_, clean = _run(q, k, v, grad=True, causal=True)
    q[1, 20, 0, 3] = NAN
    *_, (dq, dk, dv) = _run(q, k, v, grad=True, causal=True)
    other = torch.ones(dq.shape[:3], dtype=torch.bool, device=DEVICE)
    other[1, 20, 0] = False
    assert torch.equal(dq[other], clean[0][other]), "a NaN query changed dq of other rows"
    assert torch.equal(dk[0], clean[1][0]) and torch.equal(dv[0], clean[2][0]), "a NaN query changed another batch"
    assert torch.isnan(dq[1, 20, 0]).all(), "dq of the NaN row should be NaN"


# ---------------------------------------------------------------------------
# A non-finite key row: the mask is applied to scores, so rows that do not attend
# to it never read it.


@pytest.mark.parametrize("options",
                         [{"causal": True}, {"window_size": (5, 3)}, {"causal": True, "window_size": (7, -1)}],
                         ids=["causal", "window", "causal-window"])
def test_nan_key_row_reaches_exactly_the_rows_attending_it(backend, options, request):
    seqlen_q, seqlen_k, j = 40, 45, 25
    q, k, v = _inputs(seqlen_q, seqlen_k)
    clean_out, clean_lse, _ = _run(q, k, v, **options)
    k[0, j, 0, 5] = NAN  # batch 0, key j, the only KV head
    out, lse, _ = _run(q, k, v, **options)
    attends = _visible(seqlen_q, seqlen_k, options.get("causal", False), options.get("window_size", (-1, -1)))[:, j]
    assert attends.any() and (~attends).any(), "the test needs rows on both sides"
    # Rows that do not attend to key j, and the other batch entry: bit-identical.
    assert torch.equal(out[0][~attends], clean_out[0][~attends]), "a NaN key reached rows masked away from it"
    assert torch.equal(out[1], clean_out[1]) and torch.equal(lse[1], clean_lse[1]), "a NaN key reached another batch"
    assert torch.equal(lse[0][:, ~attends], clean_lse[0][:, ~attends])
    assert _rows(out[0], 0)[attends].all(), "rows attending a NaN key should be NaN"


def test_nan_key_row_full_attention_poisons_every_row_of_its_batch(backend, request):
    q, k, v = _inputs()
    clean_out, _, _ = _run(q, k, v)
    k[0, 7, 0, 0] = NAN
    out, _, _ = _run(q, k, v)
    assert torch.isnan(out[0]).all(), "every query attends key 7 without a mask"
    assert torch.equal(out[1], clean_out[1])


# ---------------------------------------------------------------------------
# A non-finite value row: P·V is a matrix product, and 0 · NaN = NaN, so a masked
# probability does not protect a row that shares a tile with the bad value.


@pytest.mark.parametrize("value", [NAN, INF], ids=["nan", "inf"])
def test_nonfinite_value_row_reaches_the_rows_attending_it(backend, value):
    q, k, v = _inputs()
    v[0, 20, 0, 2] = value
    out, lse, _ = _run(q, k, v, causal=True)
    attends = _visible(40, 40, True, (-1, -1))[:, 20]
    assert _rows(out[0], 0)[attends].all(), "rows attending a non-finite value should be non-finite"
    assert torch.isfinite(lse).all(), "V never enters the LSE"


def test_nonfinite_value_row_spares_query_tiles_that_never_visit_it(backend):
    # Causal, seqlen 278, bad value at key 268: query rows < 256 only visit key tiles
    # below 256 for every tile size up to 256 (the reference's largest, reference.tiled.TILE_SIZES),
    # so they are untouched.
    q, k, v = _inputs(278, 278, heads_q=1, batch=1)
    clean_out, _, _ = _run(q, k, v, causal=True)
    v[0, 268, 0, 2] = NAN
    out, _, _ = _run(q, k, v, causal=True)
    assert torch.equal(out[0, :256], clean_out[0, :256])
    assert torch.isnan(out[0, 268:, :, 2]).all(), "rows attending the NaN value should be NaN in its column"


def test_nonfinite_value_row_leaks_into_masked_rows_of_the_same_tile(backend):
    # Documented limitation: query 7 does not attend key 8 (causal), but the tile pair
    # (rows 0..15+, keys 0..15+) is visited for rows 8.., so P·V multiplies 0 by NaN.
    q, k, v = _inputs()
    v[0, 8, 0, 2] = NAN
    out, _, _ = _run(q, k, v, causal=True)
    assert torch.isnan(out[0, 7]).any(), \
        "if this now holds finite, the doc's limitation is fixed: update docs/errors.md"


def test_fully_masked_rows_stay_zero_next_to_a_nonfinite_value(backend, request):
    # seqlen_q 20 > seqlen_k 5, causal (bottom-right): rows 0..14 see no key.
    q, k, v = _inputs(20, 5, heads_q=1, batch=1)
    v[0, 4, 0, 0] = NAN
    out, lse, _ = _run(q, k, v, causal=True)
    assert torch.equal(out[0, :15], torch.zeros_like(out[0, :15])), "fully masked rows must be 0"
    assert (lse[0, :, :15] == -INF).all()


def test_the_oracle_spreads_a_nan_value_to_every_row():
    # naive_attention multiplies the whole P (masked entries 0) by V: it cannot judge
    # which rows a NaN in V may reach, so the tests above compare with clean runs.
    q, k, v = _inputs()
    v[0, 30, 0, 0] = NAN
    out = flashtile.naive_attention(q, k, v, causal=True)
    assert torch.isnan(out[0]).any(-1).all() and torch.isfinite(out[1]).all()


# ---------------------------------------------------------------------------
# -inf in the additive bias is a mask, not a non-finite input.


def test_minus_inf_bias_masks_like_the_band(backend):
    q, k, v = _inputs()
    visible = _visible(40, 40, True, (-1, -1))
    bias = torch.zeros(40, 40, device=DEVICE).masked_fill(~visible, -INF)
    out, lse, grads = _run(q, k, v, grad=True, bias=bias)
    ref_out, ref_lse, ref_grads = _run(q, k, v, grad=True, causal=True)
    assert (out - ref_out).abs().max() < 1e-5 and (lse - ref_lse).abs().max() < 1e-5
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all() and (g - r).abs().max() < 1e-4


def test_minus_inf_bias_over_a_whole_row_gives_zero(backend):
    # A row the bias hides entirely behaves as a fully masked row: 0, LSE -inf, zero dq.
    # (The oracle gives NaN there: it only treats rows hidden by the band as masked.)
    q, k, v = _inputs()
    bias = torch.zeros(2, 1, 40, 40, device=DEVICE)
    bias[:, :, 9] = -INF
    bias[:, :, 30, :20] = -INF  # row 30: a whole key tile hidden, the rest visible
    out, lse, (dq, dk, dv) = _run(q, k, v, grad=True, bias=bias)
    assert torch.equal(out[:, 9], torch.zeros_like(out[:, 9])) and (lse[:, :, 9] == -INF).all()
    assert torch.equal(dq[:, 9], torch.zeros_like(dq[:, 9]))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in (dq, dk, dv))
    ref = flashtile.naive_attention(q, k, v, bias=bias)
    assert (out[:, 30] - ref[:, 30]).abs().max() < 1e-5


def test_nan_bias_entry_poisons_only_its_row(backend, request):
    q, k, v = _inputs()
    clean_out, _, _ = _run(q, k, v)
    bias = torch.zeros(40, 40, device=DEVICE)
    bias[12, 33] = NAN
    out, _, _ = _run(q, k, v, bias=bias)
    others = torch.arange(40, device=DEVICE) != 12
    assert torch.equal(out[:, others], clean_out[:, others]), "a NaN bias entry changed other rows"
    assert torch.isnan(out[:, 12]).all()


# ---------------------------------------------------------------------------
# Split-KV decoding merges parts by their LSE: a part whose LSE said "no key" (-inf)
# would be dropped, so a NaN in the cache must give the part a NaN LSE, not -inf.


@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_nan_in_the_kv_cache_reaches_the_decode_output(backend, num_splits, request):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 2, 16, generator=g).to(DEVICE)
    k_cache, v_cache = (torch.randn(1, 64, 1, 16, generator=g).to(DEVICE) for _ in range(2))
    k_cache[0, 5, 0, 0] = NAN
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=64, num_splits=num_splits)
    assert torch.isnan(out).all(), "every query attends the NaN key: the output must be NaN, not a finite number"


def test_merging_a_part_that_holds_a_nan(backend, request):
    q, k, v = _inputs(1, 32, heads_q=1, batch=1)
    k[0, 3, 0, 0] = NAN
    o1, l1, _ = _run(q, k[:, :16], v[:, :16])
    o2, l2, _ = _run(q, k[:, 16:], v[:, 16:])
    out, _ = flashtile.merge_attention_states([o1, o2], [l1, l2])
    assert torch.isnan(out).all(), "merging must not hide the NaN of one part"
