"""The float64 oracle (``naive_attention``) against an independent textbook formula.

Everything the oracle is trusted for is rebuilt here from the definitions in
DESIGN.md: masks from explicit Python loops over (i, j), ALiBi from its formula,
softmax written out with a max, a sum and a log. Nothing from flashtile.masks is
used, so a shared mistake cannot hide.
"""

import math

import pytest
import torch

from flashtile import naive_attention
from flashtile.testing import assert_close_to_oracle, max_error, tolerance

from helpers import make_qkv, random_slopes

F64 = dict(dtype=torch.float64)


# ---------------------------------------------------------------------------
# The textbook: explicit masks and a written-out softmax, all in float64.


def allowed_mask(seqlen_q, seqlen_k, *, causal=False, window=(-1, -1)) -> torch.Tensor:
    """(Sq, Sk) bool from the rule: query i sees key j when
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1 = unbounded); causal sets right = 0."""
    left, right = window
    if causal:
        right = 0
    rows = []
    for i in range(seqlen_q):
        diag = i + seqlen_k - seqlen_q
        rows.append([(left < 0 or j >= diag - left) and (right < 0 or j <= diag + right) for j in range(seqlen_k)])
    return torch.tensor(rows, dtype=torch.bool)


def alibi_textbook(slopes, batch, heads, seqlen_q, seqlen_k) -> torch.Tensor:
    """(B, H, Sq, Sk) bias -slope[b, h] * |i + Sk - Sq - j|, by loops."""
    slopes = slopes.double().expand(batch, heads) if slopes.dim() == 2 else slopes.double()[None].expand(batch, heads)
    bias = torch.empty(batch, heads, seqlen_q, seqlen_k, **F64)
    for b in range(batch):
        for h in range(heads):
            for i in range(seqlen_q):
                for j in range(seqlen_k):
                    bias[b, h, i, j] = -slopes[b, h] * abs(i + seqlen_k - seqlen_q - j)
    return bias


def textbook(q, k, v, allowed, *, scale=None, softcap=0.0, bias=None, keep=None, dropout_p=0.0):
    """softmax(mask(cap(Q Kᵀ · scale) + bias)) V with q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D).

    Returns out (B, Hq, Sq, D) and lse (B, Hq, Sq); rows with no allowed key give 0 and -inf.
    """
    q, k, v = q.double(), k.double(), v.double()
    heads_q, heads_kv, headdim = q.shape[1], k.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(headdim) if scale is None else scale
    kv_head = [h // (heads_q // heads_kv) for h in range(heads_q)]  # GQA: query head h reads KV head h // group
    k, v = k[:, kv_head], v[:, kv_head]
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    allowed = allowed.expand(s.shape)
    has_key = allowed.any(dim=-1, keepdim=True)
    s = s.masked_fill(~allowed, float("-inf"))
    m = torch.where(has_key, s.amax(dim=-1, keepdim=True), 0.0)
    e = torch.exp(s - m)  # exactly 0 where masked
    total = torch.where(has_key, e.sum(dim=-1, keepdim=True), 1.0)
    p = e / total
    lse = torch.where(has_key, m + torch.log(total), float("-inf")).squeeze(-1)
    if keep is not None:
        p = p * keep.double() / (1.0 - dropout_p)
    return torch.einsum("bhij,bhjd->bhid", p, v), lse


def bhsd(*ts):
    return [t.transpose(1, 2) for t in ts]


def assert_same(actual, expected, what):
    err = max_error(actual, expected)
    assert err <= 1e-10, f"{what}: oracle differs from the textbook formula by {err:.3e} (both float64)"


def run_both(q, k, v, *, allowed, textbook_kwargs=None, **oracle_kwargs):
    """Oracle (bshd inputs) and textbook on the same float64 inputs; compares out and LSE."""
    out, lse = naive_attention(q, k, v, return_lse=True, **oracle_kwargs)
    exp_out, exp_lse = textbook(*bhsd(q, k, v), allowed, **(textbook_kwargs or {}))
    assert out.dtype == torch.float64 and lse.dtype == torch.float64, "oracle must compute in float64"
    assert_same(out.transpose(1, 2), exp_out, "out")
    assert_same(lse, exp_lse, "lse")
    return out, lse


# ---------------------------------------------------------------------------
# The textbook masks themselves match DESIGN.md's pictures.


def test_textbook_masks_match_the_documented_pictures():
    # seqlen_q=3, seqlen_k=5, causal (bottom-right): row i sees keys <= i + 2.
    assert allowed_mask(3, 5, causal=True).int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # seqlen_q=5, seqlen_k=3, causal: the first two rows see nothing.
    assert allowed_mask(5, 3, causal=True).int().tolist() == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # window (1, 0) on a square: the diagonal and one to the left.
    assert allowed_mask(3, 3, window=(1, 0)).int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]


# ---------------------------------------------------------------------------
# Forward: out and LSE.


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(6, 6), (5, 11), (11, 5), (1, 9), (9, 1)])
def test_causal_is_bottom_right(seqlen_q, seqlen_k):
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 3, 3, 8, requires_grad=False, **F64)
    run_both(q, k, v, causal=True, allowed=allowed_mask(seqlen_q, seqlen_k, causal=True))


def test_causal_is_not_top_left():
    # Guards the test above: for seqlen_q < seqlen_k the two alignments differ.
    q, k, v = make_qkv(1, 3, 7, 1, 1, 8, requires_grad=False, **F64)
    out = naive_attention(q, k, v, causal=True)
    top_left = torch.tensor([[j <= i for j in range(7)] for i in range(3)])
    wrong, _ = textbook(*bhsd(q, k, v), top_left)
    assert max_error(out.transpose(1, 2), wrong) > 1e-3, "causal mask looks top-left aligned"


@pytest.mark.parametrize("window", [(0, 0), (2, 1), (3, -1), (-1, 2), (0, -1), (4, 4)])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(9, 9), (6, 13), (13, 6)])
def test_window(window, seqlen_q, seqlen_k):
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 2, 2, 8, requires_grad=False, **F64)
    run_both(q, k, v, window_size=window, allowed=allowed_mask(seqlen_q, seqlen_k, window=window))


@pytest.mark.parametrize("window", [(3, -1), (2, 5), (-1, -1)])
def test_causal_with_window(window):
    q, k, v = make_qkv(1, 10, 14, 2, 2, 8, requires_grad=False, **F64)
    run_both(q, k, v, causal=True, window_size=window,
             allowed=allowed_mask(10, 14, causal=True, window=window))


def test_softcap():
    # Scores of size ~5 so that a cap of 2 bends them a lot.
    q, k, v = make_qkv(2, 7, 9, 2, 2, 16, requires_grad=False, scale=2.5, **F64)
    out, _ = run_both(q, k, v, softcap=2.0, allowed=allowed_mask(7, 9), textbook_kwargs={"softcap": 2.0})
    assert max_error(out, naive_attention(q, k, v)) > 1e-2, "softcap=2 did not change the result"


@pytest.mark.parametrize("slope_shape", ["heads", "batch_heads"])
@pytest.mark.parametrize("seqlen_q, seqlen_k, causal", [(8, 8, False), (5, 12, False), (12, 5, True), (6, 10, True)])
def test_alibi(slope_shape, seqlen_q, seqlen_k, causal):
    batch, heads = 2, 3
    slopes = random_slopes(heads) if slope_shape == "heads" else random_slopes(batch, heads)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads, 8, requires_grad=False, **F64)
    run_both(q, k, v, causal=causal, alibi_slopes=slopes,
             allowed=allowed_mask(seqlen_q, seqlen_k, causal=causal),
             textbook_kwargs={"bias": alibi_textbook(slopes, batch, heads, seqlen_q, seqlen_k)})


@pytest.mark.parametrize("heads_q, heads_kv", [(4, 2), (6, 2), (4, 1), (3, 3)])
def test_gqa(heads_q, heads_kv):
    q, k, v = make_qkv(2, 7, 9, heads_q, heads_kv, 8, requires_grad=False, **F64)
    run_both(q, k, v, causal=True, allowed=allowed_mask(7, 9, causal=True))


@pytest.mark.parametrize("bias_shape", [(2, 3, 6, 10), (1, 1, 6, 10), (1, 3, 1, 10)])
def test_additive_bias(bias_shape):
    q, k, v = make_qkv(2, 6, 10, 3, 3, 8, requires_grad=False, **F64)
    bias = torch.randn(bias_shape, **F64) * 2
    run_both(q, k, v, bias=bias, allowed=allowed_mask(6, 10), textbook_kwargs={"bias": bias})


def test_dropout_with_keep_mask():
    q, k, v = make_qkv(2, 6, 10, 3, 3, 8, requires_grad=False, **F64)
    keep = torch.rand(2, 3, 6, 10) > 0.3
    out, lse = run_both(q, k, v, causal=True, dropout_p=0.3, dropout_mask=keep,
                        allowed=allowed_mask(6, 10, causal=True), textbook_kwargs={"keep": keep, "dropout_p": 0.3})
    plain_out, plain_lse = naive_attention(q, k, v, causal=True, return_lse=True)
    assert max_error(lse, plain_lse) == 0.0, "dropout must not change the LSE"
    assert max_error(out, plain_out) > 1e-3, "the keep-mask was ignored"


def test_dropout_without_mask_is_an_error():
    q, k, v = make_qkv(1, 4, 4, 1, 1, 8, requires_grad=False, **F64)
    with pytest.raises(ValueError, match="dropout_mask"):
        naive_attention(q, k, v, dropout_p=0.1)


def test_default_scale_is_inverse_sqrt_headdim():
    q, k, v = make_qkv(1, 5, 5, 2, 2, 24, requires_grad=False, **F64)
    run_both(q, k, v, allowed=allowed_mask(5, 5), textbook_kwargs={"scale": 1 / math.sqrt(24)})
    run_both(q, k, v, softmax_scale=0.7, allowed=allowed_mask(5, 5), textbook_kwargs={"scale": 0.7})


def test_bhsd_layout_is_the_transpose():
    q, k, v = make_qkv(2, 5, 8, 4, 2, 8, requires_grad=False, layout="bhsd", **F64)
    out, lse = naive_attention(q, k, v, causal=True, layout="bhsd", return_lse=True)
    exp_out, exp_lse = textbook(q, k, v, allowed_mask(5, 8, causal=True))
    assert out.shape == q.shape, f"bhsd out shape {tuple(out.shape)} != q's {tuple(q.shape)}"
    assert_same(out, exp_out, "out (bhsd)")
    assert_same(lse, exp_lse, "lse (bhsd)")


def test_low_precision_baseline_runs_in_the_input_dtype():
    q, k, v = make_qkv(1, 33, 33, 2, 2, 32, requires_grad=False, dtype=torch.float16)
    out, lse = naive_attention(q, k, v, causal=True, upcast=False, return_lse=True)
    truth, truth_lse = naive_attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    err = max_error(out, truth)
    # Nonzero (float16 rounding happened) yet small: a sane yardstick for the contract.
    assert 0 < err < 1e-2, f"float16 baseline error {err:.3e} is not a float16-sized error"


# ---------------------------------------------------------------------------
# Fully masked rows and gradients.


@pytest.mark.parametrize("case", ["causal_sq_gt_sk", "window_sq_gt_sk"])
def test_fully_masked_rows(case):
    seqlen_q, seqlen_k = 9, 4
    kwargs = {"causal": True} if case == "causal_sq_gt_sk" else {"window_size": (0, 0)}
    allowed = allowed_mask(seqlen_q, seqlen_k, causal=kwargs.get("causal", False),
                           window=kwargs.get("window_size", (-1, -1)))
    empty_rows = ~allowed.any(dim=-1)
    assert empty_rows.sum() == seqlen_q - seqlen_k, "test setup: expected some fully masked rows"
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 2, 2, 8, **F64)
    out, lse = run_both(q, k, v, allowed=allowed, **kwargs)
    assert (out[:, empty_rows] == 0).all(), "fully masked rows must give out = 0"
    assert torch.isneginf(lse[:, :, empty_rows]).all(), "fully masked rows must give LSE = -inf"
    assert torch.isfinite(lse[:, :, ~empty_rows]).all()

    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    loss = (out * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()
    loss.backward()
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        assert torch.isfinite(t.grad).all(), f"{name}: non-finite gradient from masked rows"
    assert (q.grad[:, empty_rows] == 0).all(), "dq of fully masked rows must be 0"
    assert q.grad[:, ~empty_rows].abs().max() > 0, "dq of visible rows is zero: the test proves nothing"


def _textbook_grads(q, k, v, allowed, dout, dlse, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in bhsd(q, k, v)]
    out, lse = textbook(*leaves, allowed, **kwargs)
    loss = (out * dout.transpose(1, 2)).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()
    loss.backward()
    return [t.grad.transpose(1, 2) for t in leaves]


@pytest.mark.parametrize("options", [
    {"causal": True},
    {"window_size": (2, 1)},
    {"softcap": 1.5},
    {"alibi": True, "causal": True},
])
def test_gradients_match_the_textbook(options):
    options = dict(options)
    seqlen_q, seqlen_k, batch, heads_q, heads_kv = 7, 5, 2, 4, 2
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, 8, scale=2.0, **F64)
    allowed = allowed_mask(seqlen_q, seqlen_k, causal=options.get("causal", False),
                           window=options.get("window_size", (-1, -1)))
    textbook_kwargs = {"softcap": options.get("softcap", 0.0)}
    if options.pop("alibi", False):
        options["alibi_slopes"] = random_slopes(heads_q)
        textbook_kwargs["bias"] = alibi_textbook(options["alibi_slopes"], batch, heads_q, seqlen_q, seqlen_k)
    out, lse = naive_attention(q, k, v, return_lse=True, **options)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()).backward()
    expected = _textbook_grads(q, k, v, allowed, dout, dlse, **textbook_kwargs)
    for name, t, e in zip(("dq", "dk", "dv"), (q, k, v), expected):
        err = max_error(t.grad, e)
        assert err <= 1e-10, f"{name}: oracle gradient differs from the textbook's by {err:.3e}"


def test_gradcheck_with_fully_masked_rows():
    # Finite differences: the oracle's backward is the derivative of its forward,
    # including rows that see no key (LSE = -inf is kept out of the checked outputs).
    q, k, v = make_qkv(1, 5, 3, 2, 1, 4, **F64)
    slopes = random_slopes(2)

    def f(q, k, v):
        out, lse = naive_attention(q, k, v, causal=True, softcap=3.0, alibi_slopes=slopes, return_lse=True)
        return out, torch.where(torch.isfinite(lse), lse, 0.0)

    assert torch.autograd.gradcheck(f, (q, k, v))


# ---------------------------------------------------------------------------
# The contract's own machinery must be able to fail.


def test_max_error_handles_infinities_and_nan():
    a = torch.tensor([1.0, float("-inf"), 2.0])
    assert max_error(a, torch.tensor([1.0, float("-inf"), 2.5])) == 0.5
    assert max_error(a, torch.tensor([1.0, float("inf"), 2.0])) == float("inf")
    assert max_error(torch.tensor([float("nan")]), torch.tensor([0.0])) == float("inf")
    with pytest.raises(ValueError, match="shape"):
        max_error(torch.zeros(2), torch.zeros(3))


def test_assert_close_to_oracle_fails_outside_the_bound():
    truth = torch.randn(100, **F64)
    baseline = truth + 1e-3
    assert tolerance(1e-3) == pytest.approx(2e-3 + 1e-5)
    assert tolerance(1e-3, grad=True) == pytest.approx(3e-3 + 1e-5)
    assert_close_to_oracle("x", truth + 1.9e-3, truth, baseline)
    with pytest.raises(AssertionError, match="x: max error"):
        assert_close_to_oracle("x", truth + 2.1e-3, truth, baseline)
    assert_close_to_oracle("dx", truth + 2.9e-3, truth, baseline, grad=True)
    with pytest.raises(AssertionError, match="dx: max error"):
        assert_close_to_oracle("dx", truth + 3.1e-3, truth, baseline, grad=True)
