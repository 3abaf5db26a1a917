"""Minimal cases found by the property tests (tests/test_properties.py) and by hand.

Each test names what went wrong. A test marked ``xfail(strict=True)`` documents a
known bug or a known gap in the numerical contract that is not fixed yet: once it is,
the test passes, strict mode turns that into a failure, and the marker comes off.
"""

from __future__ import annotations

import pytest
import torch

import flashtile
from flashtile.testing import assert_close_to_oracle, max_error

from test_properties import Case, check_case

HAS_CUDA = torch.cuda.is_available()
# CPU tensors through the interpreter only on CPU-only machines (conftest sets TRITON_INTERPRET=1 there).
BACKENDS = ["reference"] + ([] if HAS_CUDA else ["triton"])


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def _grads_against_oracle(case: Case):
    """flashtile's dq and the float64 oracle's / the same-dtype baseline's, for ``case`` (native face)."""
    g = torch.Generator().manual_seed(case.data_seed)
    dtype = getattr(torch, case.dtype)
    q = torch.randn(case.batch, case.seqlen_q, case.heads_q, case.headdim, generator=g).to(dtype)
    k = torch.randn(case.batch, case.seqlen_k, case.heads_kv, case.headdim, generator=g).to(dtype)
    v = torch.randn(case.batch, case.seqlen_k, case.heads_kv, case.headdim, generator=g).to(dtype)
    dout = torch.randn(q.shape, generator=g).to(dtype)
    mask = None
    if case.dropout_p > 0:
        mask = flashtile.dropout_keep_mask(case.dropout_seed, case.dropout_p, case.batch, case.heads_q,
                                           case.seqlen_q, case.seqlen_k)
    options = dict(softmax_scale=case.softmax_scale, dropout_p=case.dropout_p)

    def grads(fn, *tensors):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        return torch.autograd.grad(fn(*leaves), leaves, dout.to(leaves[0].dtype))

    ours = grads(lambda *t: flashtile.attention(*t, dropout_seed=case.dropout_seed if case.dropout_p else None,
                                                **options), q, k, v)
    truth = grads(lambda *t: flashtile.naive_attention(*t, dropout_mask=mask, **options), q, k, v)
    base = grads(lambda *t: flashtile.naive_attention(*t, dropout_mask=mask, upcast=False, **options), q, k, v)
    return ours, truth, base


# ---------------------------------------------------------------------------
# The FlashAttention backward reads O as stored (rounded to the input dtype) in
# D = rowsum(dO ∘ O). Where dS = P ∘ (dP - D) cancels exactly — a row that sees one key,
# a saturated softmax, the gradient of a scalar bias — the true gradient is 0 and
# standard attention's own error is exactly 0, so the contract (3 × PyTorch's error
# + 1e-5) demands 1e-5 absolute while the rounding of O alone gives ~1e-4 in float16.
# Found by the property tests; check_case judges such gradients against "the oracle
# given the stored out" (tests/test_properties.py, _rounding_of_d).

# dropout_seed keeps the one key (seed 2 did under the four-columns-per-call keep mask and
# drops it under the current one: the row is then empty and the gap does not show).
ONE_KEY_FP16_DROPOUT = Case("attention", 1, 1, 1, 1, 1, 16, "float16", dropout_p=0.3, dropout_seed=3, data_seed=2)


def test_one_key_row_float16_gradients_match_the_oracle_given_the_stored_output(backend):
    check_case(ONE_KEY_FP16_DROPOUT, backend)


@pytest.mark.xfail(strict=True, reason="contract gap: D = rowsum(dO ∘ O) uses O rounded to float16; the true dq is "
                                       "0 and PyTorch's error is exactly 0, so 3 × 0 + 1e-5 is below O's rounding")
def test_one_key_row_float16_gradients_under_the_plain_contract(backend):
    ours, truth, base = _grads_against_oracle(ONE_KEY_FP16_DROPOUT)
    assert max_error(truth[0], torch.zeros_like(truth[0])) == 0, "the true dq of a one-key row is exactly 0"
    assert_close_to_oracle("dq", ours[0], truth[0], base[0], grad=True)


# The same cancellation in float32, where O is stored exactly (O = V for one key): the
# residual is float32 rounding of dP - D, about eps32 × |dO·V| × |q| × scale × group,
# which exceeds the contract's absolute 1e-5 once logits are large (here scale 2 on
# headdim 40, 3 query heads per KV head). The property tests keep logits in a realistic
# range; this case stays here until the contract's slack scales with the magnitudes.
LARGE_LOGITS_FP32_ONE_KEY = Case("attention", 1, 1, 1, 3, 1, 40, "float32", softmax_scale=2.0, data_seed=0)


@pytest.mark.xfail(strict=True, reason="contract gap: the absolute slack 1e-5 does not scale with the gradient's "
                                       "magnitude (float32 rounding of dP - D at large logits, true dk = 0)")
def test_one_key_row_float32_large_logits(monkeypatch):
    # Found on the reference backend; whether a given rounding crosses 1e-5 depends on the
    # backend's summation order, so the case is pinned to the backend it was found on.
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    check_case(LARGE_LOGITS_FP32_ONE_KEY, "reference")


def test_one_key_row_float32_large_logits_is_rounding_only(backend):
    # What the xfail above misses is rounding: relative to the gradient's natural scale
    # (|dO·V| · |q| · scale · group) the error is at float32 precision.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, h, 40, generator=g) for h in (3, 1, 1))
    dout = torch.randn(q.shape, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dq, dk, dv = torch.autograd.grad(flashtile.attention(*leaves, softmax_scale=2.0), leaves, dout)
    natural = float((dout * v).sum(-1).abs().max() * q.abs().max() * 2.0 * 3)
    assert dk.abs().max() <= 1e-6 * natural, f"dk should be 0 up to float32 rounding, got {dk.abs().max():.3e}"
    assert dq.abs().max() <= 1e-6 * natural and torch.equal(dv, dout.sum(2, keepdim=True))


# A one-key row with a gradient into the LSE: the true dq is dLSE · k · scale (dS = dLSE, P = 1),
# and standard attention's own error is exactly 0 here. The kernels feed dS to the dQ product
# in the input dtype, as FlashAttention does, so float16 rounds it by up to 2^-11: 2.4e-4 on a
# dq of ~0.5, past the contract's 3 × 0 + 1e-5. The reference keeps dS in float32 and passes.
# Found by the property tests' explore profile in the interpreter (session 17); main's kernels
# give the same bits.
ONE_KEY_FP16_LSE_GRAD = Case("qkvpacked", 1, 1, 1, 1, 1, 33, "float16", softmax_scale=0.24751666706200787,
                             return_lse=True, lse_grad=True, data_seed=1531)


@pytest.mark.xfail(strict=True, reason="contract gap: dS reaches the dQ product rounded to float16, where standard "
                                       "attention's error is exactly 0 (a one-key row with an LSE gradient)")
def test_one_key_row_float16_lse_gradient_under_the_plain_contract(monkeypatch):
    if HAS_CUDA:  # (the kernels on CPU tensors need the interpreter, which conftest sets only without CUDA)
        pytest.skip("pinned to the interpreter it was found in")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    check_case(ONE_KEY_FP16_LSE_GRAD, "triton")


def test_one_key_row_float16_lse_gradient_is_float16_rounding_only(backend):
    # What the xfail above misses is the input dtype's rounding of dS: relative to dq's own
    # size the error is within float16's 2^-10 (one rounding of dS, one of the product).
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 1, 33, generator=g).half() for _ in range(3))
    dout, dlse = torch.randn(1, 1, 1, 33, generator=g).half(), torch.randn(1, 1, 1, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashtile.attention(*leaves, softmax_scale=0.25, return_lse=True)
    (dq,) = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), leaves[0])
    exact = dlse.double() * k.double() * 0.25  # one key: dS = dLSE, so dq = dLSE · k · scale
    assert (dq.double() - exact).abs().max() <= 2 ** -10 * exact.abs().max(), "dq is off by more than rounding"


# A bias broadcast from one value: its gradient is the sum of dS over every (batch, head, query,
# key), which is exactly 0 (each row of dS sums to 0: D_i = Σ_j P_ij dP_ij). What comes back is
# the float32 rounding of ~29k terms, about 4e-9 of Σ|dS|, but 1–2e-5 in absolute terms, past
# the contract's 3 × PyTorch's error + 1e-5 (PyTorch's autograd takes D from P itself). Found
# by the explore profile of the property tests (session 17); main's reference failed it the
# same way with 64-row tiles (1.6e-5).
SCALAR_BIAS_FP32 = Case("attention", 3, 66, 49, 3, 1, 93, "float32", causal=True, bias_shape=(1, 1, 1, 1),
                        bias_grad=True, data_seed=0)


@pytest.mark.xfail(strict=True, reason="contract gap: the absolute slack 1e-5 does not scale with the number of "
                                       "terms a broadcast bias's gradient sums (the true value is 0)")
def test_scalar_bias_gradient_float32(monkeypatch):
    if HAS_CUDA:  # (the H200 machine's CPU rounds these float32 sums otherwise: it passed there, session 18)
        pytest.skip("pinned to the CPU-only machine it was found on")
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    check_case(SCALAR_BIAS_FP32, "reference")


def test_scalar_bias_gradient_float32_is_rounding_only(backend):
    # What the xfail above misses is rounding: against Σ|dS| (the float64 oracle's, per element)
    # the error is far below float32's epsilon.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 66, 3, 93, generator=g)
    k, v = (torch.randn(3, 49, 1, 93, generator=g) for _ in range(2))
    dout = torch.randn(q.shape, generator=g)
    bias = torch.zeros(1, 1, 1, 1, requires_grad=True)
    (dbias,) = torch.autograd.grad(flashtile.attention(q, k, v, causal=True, bias=bias), bias, dout)
    per_element = torch.zeros(3, 3, 66, 49, dtype=torch.float64, requires_grad=True)
    (ds,) = torch.autograd.grad(flashtile.naive_attention(q.double(), k.double(), v.double(), causal=True,
                                                          bias=per_element), per_element, dout.double())
    assert abs(float(ds.sum())) < 1e-10, "the true gradient of a broadcast scalar bias is 0"
    assert abs(float(dbias)) <= 1e-7 * float(ds.abs().sum()), f"{float(dbias):.3e} is more than float32 rounding"


# ---------------------------------------------------------------------------
# Bugs.


def test_float64_dropout_gradients_are_float64_accurate(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1, 16, generator=g, dtype=torch.float64) for _ in range(3))
    dout = torch.randn(q.shape, generator=g, dtype=torch.float64)
    mask = flashtile.dropout_keep_mask(1, 0.1, 1, 1, 8, 8)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(flashtile.attention(*ours, dropout_p=0.1, dropout_seed=1), ours, dout)
    ref_grads = torch.autograd.grad(flashtile.naive_attention(*ref, dropout_p=0.1, dropout_mask=mask), ref, dout)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert max_error(a, b) <= 1e-12 * float(b.abs().max()), f"{name}: {max_error(a, b):.3e}"


def test_float64_bias_gradient_is_float64_accurate(monkeypatch):
    # The reference backward accumulated dBias in float32 whatever the inputs (error 1.2e-7
    # against float64 autograd, where dq, dk, dv were at 1e-15).
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(2, 9, 9, generator=g, dtype=torch.float64)
    dout = torch.randn(q.shape, generator=g, dtype=torch.float64)
    ours = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    ref = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    dbias = torch.autograd.grad(flashtile.attention(*ours[:3], bias=ours[3], causal=True), ours[3], dout)[0]
    ref_dbias = torch.autograd.grad(flashtile.naive_attention(*ref[:3], bias=ref[3], causal=True), ref[3], dout)[0]
    assert dbias.dtype == torch.float64
    assert max_error(dbias, ref_dbias) <= 1e-12 * float(ref_dbias.abs().max()), f"{max_error(dbias, ref_dbias):.3e}"


def test_varlen_max_seqlen_shorter_than_a_sequence(backend, request):
    # One sequence of 20 tokens, max_seqlen 5: the kernels would launch only the query tiles
    # that max_seqlen_q covers. Fixed: a max_seqlen below a sequence's length is an error.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(20, 2, 16, generator=g) for _ in range(3))
    cu = torch.tensor([0, 20], dtype=torch.int32)
    expected = flashtile.naive_attention(q[None], k[None], v[None])[0]
    try:
        out = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5)
    except ValueError as error:  # a clear error naming the argument is the other acceptable outcome
        assert str(error).startswith("max_seqlen_q"), str(error)
        return
    assert max_error(out, expected) < 1e-5, f"max error {max_error(out, expected):.3e} with max_seqlen 5 < 20"


def test_nan_query_gives_nan_on_the_reference(monkeypatch):
    # Minimal form of the bug that tests/test_nan_inf.py shows row by row: one element.
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    q = torch.full((1, 1, 1, 1), float("nan"))
    k = v = torch.ones(1, 1, 1, 1)
    out, lse = flashtile.attention(q, k, v, return_lse=True)
    assert torch.isnan(out).all() and torch.isnan(lse).all(), f"out {out.item()}, lse {lse.item()}: expected NaN"


def test_property_case_reprs_are_runnable():
    # The repr a failing property test prints is pasted here as is: keep it evaluable.
    case = eval(repr(ONE_KEY_FP16_DROPOUT), {"Case": Case})  # noqa: S307
    assert case == ONE_KEY_FP16_DROPOUT
