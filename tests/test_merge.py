"""merge_attention_states: attention over all keys equals the merge of attention over key
chunks (forward and gradients, against the float64 oracle); the -inf rules; layouts and
dtypes; gradcheck; torch.compile; argument errors."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashtile
from flashtile.masks import normalize_window
from flashtile.merge import merge_attention_states, merge_attention_states_pair
from flashtile.testing import max_error

from helpers import check_against_oracle, make_qkv

NEG_INF = float("-inf")
LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)


# ---------------------------------------------------------------------------
# Helpers: chunked attention, random states and the float64 formula.


def chunk_window(causal, window_size, seqlen_k, start, end):
    """window_size for keys [start, end) that reproduces the full problem's band.

    Masks are aligned bottom-right, so a chunk that ends ``shift = seqlen_k - end`` keys
    before the last one sees its band moved by ``shift``: right grows by ``shift`` and
    left shrinks by it. A left bound that would go negative is not expressible (flashtile
    reads a negative bound as unbounded); the cases below keep it >= 0.
    """
    band = normalize_window(causal, window_size)
    shift = seqlen_k - end
    left = -1 if band.left is None else band.left - shift
    assert band.left is None or left >= 0, f"chunk [{start}, {end}): band not expressible, pick other bounds"
    right = -1 if band.right is None else band.right + shift
    return left, right


def chunked_attention(bounds, layout, causal=False, window_size=(-1, -1), merge="list"):
    """fn(q, k, v) -> (out, lse): flashtile.attention on each key chunk, then the merge."""
    s_dim = 1 if layout == "bshd" else 2

    def fn(q, k, v):
        seqlen_k = k.shape[s_dim]
        outs, lses = [], []
        for start, end in zip(bounds, bounds[1:]):
            window = chunk_window(causal, window_size, seqlen_k, start, end)
            k_chunk, v_chunk = k.narrow(s_dim, start, end - start), v.narrow(s_dim, start, end - start)
            out, lse = flashtile.attention(q, k_chunk, v_chunk, window_size=window, return_lse=True, layout=layout)
            outs.append(out)
            lses.append(lse)
        if merge == "pairs":  # the ring-attention way: fold one state at a time
            out, lse = outs[0], lses[0]
            for o, part_lse in zip(outs[1:], lses[1:]):
                out, lse = merge_attention_states_pair(out, lse, o, part_lse, layout=layout)
            return out, lse
        return merge_attention_states(outs, lses, layout=layout)

    return fn


LSE_DIMS = {"bshd": (0, 2, 1), "bhsd": (0, 1, 2), "thd": (1, 0)}


def lse_shape(out_shape, layout):
    return tuple(out_shape[d] for d in LSE_DIMS[layout])


def lse_to_out(x, layout):
    """(..., *lse_shape) -> broadcastable against (..., *out_shape) in ``layout``."""
    if layout in ("bshd", "thd"):  # (b, h, s) -> (b, s, h); (h, t) -> (t, h)
        x = x.transpose(-2, -1)
    return x.unsqueeze(-1)


def random_states(n, out_shape, layout, *, dtype=torch.float32, empty_fraction=0.3, spread=4.0, offset=0.0,
                  all_empty_rows=True):
    """n states with random LSEs; a fraction of (part, row) pairs empty (-inf) and, when
    ``all_empty_rows``, the first row empty in every part. Empty parts' outs hold NaN."""
    outs = torch.randn((n, *out_shape), dtype=torch.float64).to(dtype)
    lses = torch.randn((n, *lse_shape(out_shape, layout)), dtype=torch.float64) * spread + offset
    empty = torch.rand(lses.shape) < empty_fraction
    if all_empty_rows:
        empty.view(n, -1)[:, 0] = True
    lses = lses.masked_fill(empty, NEG_INF).float()
    outs = outs.masked_fill(lse_to_out(empty, layout), float("nan"))  # must not leak
    return outs, lses


def merge_float64(outs, lses, layout):
    """The formula in float64, straight from the definition."""
    outs, lses = outs.double(), lses.double()
    lse = torch.logsumexp(lses, dim=0)  # -inf on rows where every part is empty
    weights = torch.where(torch.isinf(lse), 0.0, torch.exp(lses - lse))
    weights = lse_to_out(weights, layout)
    out = torch.where(weights > 0, weights * outs, 0.0).sum(0)
    return out, lse


def merge_grads_float64(outs, lses, dout, dlse, layout):
    """Gradients of <out, dout> + <lse, dlse> from their closed form, in float64:
    d out_i = p_i dout, d lse_i = p_i (<dout, out_i - out> + dlse). (test_gradcheck checks
    the closed form against finite differences; this one is the precision yardstick.)"""
    outs, lses, dout, dlse = (t.double() for t in (outs, lses, dout, dlse))
    out, lse = merge_float64(outs, lses, layout)
    p = torch.where(torch.isinf(lse), 0.0, torch.exp(lses - lse))
    p_out = lse_to_out(p, layout)
    douts = p_out * dout
    live = torch.where(p_out > 0, outs - out, 0.0)
    row_dot = (live * dout).sum(-1)
    if layout in ("bshd", "thd"):
        row_dot = row_dot.transpose(-2, -1)
    return douts, p * (row_dot + dlse)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


# ---------------------------------------------------------------------------
# The key property: attention over all keys == merge of attention over chunks.

# (seqlen_q, seqlen_k, chunk bounds, causal, window_size); every case has uneven chunks.
CHUNK_CASES = {
    # no mask; a chunk of one key
    "full": (9, 23, (0, 4, 5, 23), False, (-1, -1)),
    # rows i < 5 see nothing of chunk 2, rows i < 13 nothing of chunk 3: LSE_i = -inf there
    "causal": (17, 17, (0, 5, 13, 17), True, (-1, -1)),
    # seqlen_q > seqlen_k: rows 0..7 see no key at all, in any chunk (out 0, LSE -inf)
    "causal-sq>sk": (20, 12, (0, 2, 7, 12), True, (-1, -1)),
    # sliding window (9, 0) over a longer cache, four chunks; the last is hidden from rows < 8
    "sliding-window": (14, 21, (0, 12, 15, 17, 21), True, (9, -1)),
    # look-ahead window (-1, 2), two chunks
    "right-window": (15, 15, (0, 9, 15), False, (-1, 2)),
}


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("case", list(CHUNK_CASES))
def test_merge_of_chunks_equals_attention_over_all_keys(case, dtype, reference_backend):
    seqlen_q, seqlen_k, bounds, causal, window_size = CHUNK_CASES[case]
    # Alternate layouts and merge forms over the grid, rather than multiplying it.
    index = list(CHUNK_CASES).index(case) + LOW_PRECISION.index(dtype)
    layout = ("bshd", "bhsd")[index % 2]
    merge = ("list", "pairs")[index // 2 % 2]
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, 16, dtype=dtype, layout=layout)
    fn = chunked_attention(bounds, layout, causal, window_size, merge)
    results = check_against_oracle(fn, q, k, v, layout=layout, lse_grad=True, causal=causal,
                                   window_size=window_size, label=f"{case}, {layout}, merge={merge}")
    if case == "causal-sq>sk":
        assert (results["out"][:, :8] if layout == "bshd" else results["out"][:, :, :8]).eq(0).all()
        assert results["lse"][:, :, :8].eq(NEG_INF).all()


def test_merge_of_chunks_lse_only_gradients(reference_backend):
    # Gradients that reach q and k through the merged LSE alone (v gets zero).
    q, k, v = make_qkv(1, 11, 19, 2, 2, 8, dtype=torch.float32)
    check_against_oracle(chunked_attention((0, 6, 19), "bshd", causal=True), q, k, v, lse_only=True, causal=True)


def test_cascade_shared_prefix_plus_suffix(reference_backend):
    # The docs/merge.md example: one prefix K/V for the whole batch (a stride-0 view,
    # never copied), each request's own suffix attended causally.
    batch, prefix, suffix, heads_q, heads_kv, headdim = 3, 13, 6, 4, 2, 16
    k_prefix, v_prefix = (torch.randn(1, prefix, heads_kv, headdim, dtype=torch.float16) for _ in range(2))
    q, k_suffix, v_suffix = make_qkv(batch, suffix, suffix, heads_q, heads_kv, headdim, dtype=torch.float16,
                                     requires_grad=False, storage="contiguous")
    expand = (batch, -1, -1, -1)
    out_prefix, lse_prefix = flashtile.attention(q, k_prefix.expand(expand), v_prefix.expand(expand),
                                                 return_lse=True)
    out_suffix, lse_suffix = flashtile.attention(q, k_suffix, v_suffix, causal=True, return_lse=True)
    out, lse = merge_attention_states_pair(out_prefix, lse_prefix, out_suffix, lse_suffix)

    k, v = (torch.cat([p.expand(expand), s], dim=1) for p, s in ((k_prefix, k_suffix), (v_prefix, v_suffix)))
    truth, truth_lse = flashtile.naive_attention(q, k, v, causal=True, return_lse=True)
    baseline, baseline_lse = flashtile.naive_attention(q, k, v, causal=True, upcast=False, return_lse=True)
    flashtile.testing.assert_close_to_oracle("out", out, truth, baseline)
    flashtile.testing.assert_close_to_oracle("lse", lse, truth_lse, baseline_lse)


# ---------------------------------------------------------------------------
# The formula itself: float64 truth, the -inf rules, algebra.


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_against_float64_formula(dtype, layout):
    out_shape = (2, 7, 3, 16) if layout != "thd" else (19, 3, 16)
    outs, lses = random_states(3, out_shape, layout, dtype=dtype)
    out, lse = merge_attention_states(list(outs), list(lses), layout=layout)
    truth, truth_lse = merge_float64(outs, lses, layout)
    assert out.dtype == dtype and out.shape == out_shape and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == lses.shape[1:]
    assert not out.isnan().any() and not lse.isnan().any()
    # float32 arithmetic, then one rounding to the output dtype
    eps = torch.finfo(dtype).eps
    assert max_error(out, truth) <= eps * float(truth.abs().max()) + 1e-6
    largest_lse = float(lses.nan_to_num(0, 0, 0).abs().max())
    assert max_error(lse, truth_lse) <= 4 * torch.finfo(torch.float32).eps * (1 + largest_lse)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 5),
    layout=st.sampled_from(["bshd", "bhsd", "thd"]),
    rows=st.integers(1, 9),
    empty_fraction=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    spread=st.sampled_from([0.0, 1.0, 30.0, 300.0]),  # 300: exp of naive sums over/underflows
    offset=st.sampled_from([0.0, -1e4, 1e4]),
    torch_seed=st.integers(0, 2**31 - 1),
)
def test_random_states_against_float64_formula(n, layout, rows, empty_fraction, spread, offset, torch_seed):
    torch.manual_seed(torch_seed)
    out_shape = (2, rows, 3, 8) if layout != "thd" else (rows, 3, 8)
    outs, lses = random_states(n, out_shape, layout, empty_fraction=empty_fraction, spread=spread, offset=offset,
                               all_empty_rows=False)
    outs, lses = leaves(outs, lses)
    out, lse = merge_attention_states(outs, lses, layout=layout)
    truth, truth_lse = merge_float64(outs.detach(), lses.detach(), layout)
    assert max_error(out, truth) <= 1e-6 * (1 + float(truth.abs().max()))
    assert max_error(lse, truth_lse) <= 1e-6 * (1 + abs(offset) + spread)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.autograd.backward((out, lse), (dout, dlse))
    truth_douts, truth_dlses = merge_grads_float64(outs.detach(), lses.detach(), dout, dlse, layout)
    assert max_error(outs.grad, truth_douts) <= 1e-6 * (1 + float(truth_douts.abs().max()))
    # float32 arithmetic: |LSE| up to 1e4 must not cost precision (the weights are not
    # recomputed from the rounded merged LSE)
    assert max_error(lses.grad, truth_dlses) <= 1e-5 * (1 + float(truth_dlses.abs().max()))


def test_single_state_is_identity():
    outs, lses = random_states(1, (2, 9, 3, 16), "bshd", dtype=torch.bfloat16, all_empty_rows=False,
                               empty_fraction=0.0)
    for form in (outs, list(outs)):  # stacked (1, ...) tensor or a list of one
        out, lse = merge_attention_states(form, lses if form is outs else list(lses))
        assert torch.equal(out, outs[0]) and torch.equal(lse, lses[0])


def test_stacked_tensor_equals_list():
    outs, lses = random_states(4, (2, 3, 5, 8), "bhsd")
    stacked = merge_attention_states(outs, lses, layout="bhsd")
    listed = merge_attention_states(list(outs), tuple(lses), layout="bhsd")
    assert all(torch.equal(a, b) for a, b in zip(stacked, listed))


def test_order_invariance_and_associativity():
    outs, lses = random_states(4, (2, 11, 3, 16), "bshd")
    out, lse = merge_attention_states(outs, lses)
    permuted = merge_attention_states(outs[[2, 0, 3, 1]], lses[[2, 0, 3, 1]])
    left, left_lse = merge_attention_states_pair(outs[0], lses[0], outs[1], lses[1])
    right, right_lse = merge_attention_states_pair(outs[2], lses[2], outs[3], lses[3])
    tree = merge_attention_states_pair(left, left_lse, right, right_lse)
    for name, (o, got_lse) in {"permuted": permuted, "tree of pairs": tree}.items():
        assert max_error(o, out) <= 1e-6, name
        assert max_error(got_lse, lse) <= 1e-6, name


def test_empty_part_gets_weight_exactly_zero():
    # An empty part (LSE -inf) contributes nothing, even when its out holds NaN or inf.
    out_a = torch.randn(2, 6, 3, 8)
    lse_a = torch.randn(2, 3, 6)
    out_b = torch.full_like(out_a, float("nan"))
    out_b[0] = float("inf")
    lse_b = torch.full_like(lse_a, NEG_INF)
    out_a, lse_a, out_b, lse_b = leaves(out_a, lse_a, out_b, lse_b)
    for args in ((out_a, lse_a, out_b, lse_b), (out_b, lse_b, out_a, lse_a)):
        out, lse = merge_attention_states_pair(*args)
        assert torch.equal(out, out_a) and torch.equal(lse, lse_a)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.autograd.backward((out, lse), (dout, dlse))
    assert torch.equal(out_b.grad, torch.zeros_like(out_b)) and torch.equal(lse_b.grad, torch.zeros_like(lse_b))
    # d out / d out_a = 1 and d lse / d lse_a = 1 (here the weight of a is exactly 1)
    assert torch.equal(out_a.grad, dout) and torch.equal(lse_a.grad, dlse)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_all_empty_rows_give_zero_out_and_gradients(dtype):
    n, out_shape = 3, (2, 4, 3, 8)
    outs, lses = random_states(n, out_shape, "bshd", dtype=dtype, empty_fraction=0.4)
    lses[:, 1, :, 2] = NEG_INF  # batch 1, every head, query row 2: no part saw a key
    outs[:, 1, 2] = float("nan")
    outs, lses = leaves(outs, lses)
    out, lse = merge_attention_states(outs, lses)
    assert torch.equal(out[1, 2], torch.zeros_like(out[1, 2])) and lse[1, :, 2].eq(NEG_INF).all()
    # The loss may even use the -inf LSE with a zero weight: 0 · (-inf) is the caller's NaN,
    # so feed a gradient directly instead; it must come back zero on those rows, finite elsewhere.
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.autograd.backward((out, lse), (dout, dlse))
    for name, grad in (("outs", outs.grad), ("lses", lses.grad)):
        assert torch.isfinite(grad).all(), f"{name}: non-finite gradient"
    assert outs.grad[:, 1, 2].eq(0).all() and lses.grad[:, 1, :, 2].eq(0).all()


def test_every_row_empty():
    outs, lses = leaves(torch.randn(2, 1, 5, 2, 8), torch.full((2, 1, 2, 5), NEG_INF))
    out, lse = merge_attention_states(outs, lses)
    assert out.eq(0).all() and lse.eq(NEG_INF).all()
    torch.autograd.backward((out, lse), (torch.randn_like(out), torch.randn_like(lse)))
    assert outs.grad.eq(0).all() and lses.grad.eq(0).all()


def test_layouts_agree():
    outs, lses = random_states(3, (2, 7, 3, 8), "bshd")
    bshd, bshd_lse = merge_attention_states(outs, lses, layout="bshd")
    bhsd, bhsd_lse = merge_attention_states(outs.transpose(2, 3), lses, layout="bhsd")
    # varlen: batch and seqlen flattened into tokens
    thd, thd_lse = merge_attention_states(outs.flatten(1, 2), lses.permute(0, 2, 1, 3).flatten(2), layout="thd")
    assert torch.equal(bhsd.transpose(1, 2), bshd) and torch.equal(bhsd_lse, bshd_lse)
    assert torch.equal(thd, bshd.flatten(0, 1)) and torch.equal(thd_lse, bshd_lse.transpose(0, 1).flatten(1))


def test_transposed_inputs_give_contiguous_output():
    outs = torch.randn(3, 2, 3, 7, 8).transpose(2, 3)  # bshd views of bhsd storage
    lses = torch.randn(3, 2, 7, 3).transpose(2, 3)
    out, _ = merge_attention_states(outs, lses)
    assert out.is_contiguous()
    truth, _ = merge_float64(outs, lses, "bshd")
    assert max_error(out, truth) <= 1e-6


def test_float64_inputs_stay_float64():
    outs, lses = random_states(2, (1, 3, 2, 4), "bshd", dtype=torch.float64)
    out, lse = merge_attention_states(outs, lses.double())
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    truth, truth_lse = merge_float64(outs, lses, "bshd")
    assert max_error(out, truth) <= 1e-12 and max_error(lse, truth_lse) <= 1e-12


# ---------------------------------------------------------------------------
# Autograd: gradcheck in float64, torch.compile.


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_gradcheck(layout):
    out_shape = (1, 3, 2, 4) if layout == "bshd" else (5, 2, 4)
    outs = torch.randn((3, *out_shape), dtype=torch.float64)
    lses = torch.randn((3, *lse_shape(out_shape, layout)), dtype=torch.float64) * 2
    lses[1].view(-1)[::3] = NEG_INF  # empty parts (finite differences of -inf stay -inf: gradient 0)
    inputs = leaves(*outs, *lses)

    def fn(*states):
        return merge_attention_states(states[:3], states[3:], layout=layout)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_gradcheck_pair():
    inputs = leaves(torch.randn(1, 3, 2, 4, dtype=torch.float64), torch.randn(1, 2, 3, dtype=torch.float64),
                    torch.randn(1, 3, 2, 4, dtype=torch.float64), torch.randn(1, 2, 3, dtype=torch.float64))
    assert torch.autograd.gradcheck(merge_attention_states_pair, inputs)


def test_gradient_formulas():
    # d out / d lse_i = p_i (out_i - out), d lse / d lse_i = p_i.
    outs, lses = leaves(torch.randn(3, 1, 2, 1, 4, dtype=torch.float64), torch.randn(3, 1, 1, 2, dtype=torch.float64))
    out, lse = merge_attention_states(outs, lses)
    p = torch.exp(lses - lse).detach()  # (3, 1, 1, 2)
    (dlse,) = torch.autograd.grad(lse.sum(), lses, retain_graph=True)
    assert torch.allclose(dlse, p)
    dout = torch.randn_like(out)
    (dlse,) = torch.autograd.grad((out * dout).sum(), lses)
    expected = p * ((outs - out).detach() * dout).sum(-1).transpose(-2, -1)
    assert torch.allclose(dlse, expected)


def test_torch_compile_fullgraph_aot_eager(reference_backend):
    torch._dynamo.reset()

    def chunked(q, k, v):
        o1, l1 = flashtile.attention(q, k[:, :5], v[:, :5], window_size=(-1, 7), return_lse=True)
        o2, l2 = flashtile.attention(q, k[:, 5:9], v[:, 5:9], window_size=(-1, 3), return_lse=True)
        o3, l3 = flashtile.attention(q, k[:, 9:], v[:, 9:], causal=True, return_lse=True)
        out, lse = merge_attention_states_pair(o1, l1, o2, l2)
        return merge_attention_states([out, o3], [lse, l3])

    q, k, v = make_qkv(2, 12, 12, 2, 2, 8, requires_grad=False)  # causal, seqlen_q = seqlen_k: -inf parts
    dout, dlse = torch.randn(q.shape), torch.randn(2, 2, 12)

    def run(fn):
        args = leaves(q, k, v)
        out, lse = fn(*args)
        torch.autograd.backward((out, lse), (dout, dlse))
        return [out.detach(), lse.detach()] + [t.grad for t in args]

    eager = run(chunked)
    compiled = run(torch.compile(chunked, fullgraph=True, backend="aot_eager"))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), compiled, eager):
        assert max_error(a, b) <= 1e-6, f"{name}: torch.compile differs from eager"
    torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Argument errors name the argument.


def _good(n=2):
    return [torch.randn(2, 5, 3, 8) for _ in range(n)], [torch.randn(2, 3, 5) for _ in range(n)]


def _bad_cases():
    outs, lses = _good()
    yield "empty", ([], []), {}, ValueError, r"outs: expected at least one"
    yield "count", (outs, lses[:1]), {}, ValueError, r"lses: expected one LSE per out \(2\), got 1"
    yield "single tensor", (outs[0], lses[0]), {}, ValueError, r"outs: .*got a single 4-d tensor.*pass \[tensor\]"
    yield "not a tensor", ([outs[0], "x"], lses), {}, TypeError, r"outs\[1\]: expected a torch.Tensor, got str"
    yield "generator", ((o for o in outs), lses), {}, TypeError, r"outs: expected a list or tuple"
    yield "rank", ([o[0] for o in outs], lses), {}, ValueError, r"outs\[0\]: expected a 4-d tensor"
    yield "out shape", ([outs[0], outs[1][:, :4]], lses), {}, ValueError, r"outs\[1\]: expected shape \(2, 5, 3, 8\)"
    yield "out dtype", ([outs[0], outs[1].half()], lses), {}, TypeError, r"outs\[1\]: expected dtype torch.float32"
    yield "int out", ([o.int() for o in outs], lses), {}, TypeError, r"outs\[0\]: expected dtype float16"
    yield "lse shape", (outs, [lses[0], lses[1].transpose(1, 2)]), {}, ValueError, \
        r"lses\[1\]: expected shape \(2, 3, 5\) = \(batch, heads, seqlen\).*got \(2, 5, 3\)"
    yield "lse layout", (outs, lses), {"layout": "bhsd"}, ValueError, r"lses\[0\]: expected shape \(2, 5, 3\)"
    yield "lse dtype", (outs, [lse.half() for lse in lses]), {}, TypeError, r"lses\[0\]: expected dtype float32"
    yield "lse dtypes", (outs, [lses[0], lses[1].double()]), {}, TypeError, r"lses\[1\]: expected dtype torch.float32"
    yield "device", (outs, [lses[0], lses[1].to("meta")]), {}, ValueError, r"lses\[1\]: expected device cpu"
    yield "layout", (outs, lses), {"layout": "sbhd"}, ValueError, r"layout: expected one of 'bshd', 'bhsd', 'thd'"


BAD_CASES = {name: rest for name, *rest in _bad_cases()}


@pytest.mark.parametrize("name", list(BAD_CASES))
def test_argument_errors(name):
    args, kwargs, error, match = BAD_CASES[name]
    with pytest.raises(error, match=match):
        merge_attention_states(*args, **kwargs)


def test_pair_argument_errors():
    (out_a, out_b), (lse_a, lse_b) = _good()
    with pytest.raises(ValueError, match=r"lse_b: expected shape \(2, 3, 5\)"):
        merge_attention_states_pair(out_a, lse_a, out_b, lse_b[:, :2])
    with pytest.raises(TypeError, match=r"out_b: expected dtype torch.float32 \(the dtype of out_a\)"):
        merge_attention_states_pair(out_a, lse_a, out_b.bfloat16(), lse_b)
    with pytest.raises(TypeError, match=r"lse_a: expected dtype float32"):
        merge_attention_states_pair(out_a, lse_a.bfloat16(), out_b, lse_b)
