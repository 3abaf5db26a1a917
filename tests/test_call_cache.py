"""flashtile.call_cache: a repeated plain call skips attention()'s checks, and nothing else
changes: the same answers (against the oracle), the same errors for bad input, and a new check
wherever anything the checks read has changed."""

import pytest
import torch

import flashtile
from flashtile import api, call_cache

from helpers import assert_grads_match_oracle, check_against_oracle, make_qkv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels: on the GPU, or in Triton's interpreter


@pytest.fixture
def checks(monkeypatch):
    """Counts the calls that ran attention()'s checks (check_qkv is their first)."""
    seen = []
    real = api.check_qkv

    def counting(*args):
        seen.append(args[3])  # the layout
        return real(*args)

    monkeypatch.setattr(api, "check_qkv", counting)
    return seen


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(causal=True, window_size=(5, -1)),
                                     dict(softmax_scale=0.3, softcap=4.0)], ids=["full", "causal", "window", "scaled"])
def test_a_repeated_call_skips_the_checks_and_matches_the_oracle(checks, layout, options):
    q, k, v = make_qkv(2, 17, 23, 4, 2, 40, layout=layout)

    def fn(q_, k_, v_):
        return flashtile.attention(q_, k_, v_, layout=layout, return_lse=True, **options)

    fn(q, k, v)
    assert len(checks) == 1
    check_against_oracle(fn, q, k, v, layout=layout, **options)  # oracle's copies: same kind of call
    assert len(checks) == 1, "a repeat of a checked call ran the checks again"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_kernels_answer_a_remembered_call_as_a_checked_one(checks, monkeypatch, causal):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = (torch.randn(1, 113, 2, 64, device=DEVICE, dtype=torch.float16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def step():
        out = flashtile.attention(q, k, v, causal=causal)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    first, (out, grads) = step(), step()
    assert len(checks) == 1
    assert torch.equal(first[0], out)  # the forward's kernels add in a fixed order
    assert_grads_match_oracle(out, grads, q, k, v, dout, causal=causal)


def test_a_hit_with_a_strided_last_dim_copies_as_the_checks_did(checks):
    q, k, v = (torch.randn(1, 9, 2, 32, 2)[..., 0].requires_grad_(False) for _ in range(3))
    assert q.stride(-1) == 2
    first = flashtile.attention(q, k, v, causal=True)
    again = flashtile.attention(q, k, v, causal=True)
    assert len(checks) == 1
    assert torch.equal(first, again)
    expected = flashtile.naive_attention(q.double(), k.double(), v.double(), causal=True)
    assert (again.double() - expected).abs().max() < 1e-5


def _variants(q, k, v):
    """Calls that differ from ``flashtile.attention(q, k, v)`` in one thing the checks read."""
    return {
        "causal": lambda: flashtile.attention(q, k, v, causal=True),
        "window": lambda: flashtile.attention(q, k, v, window_size=(3, 2)),
        "scale": lambda: flashtile.attention(q, k, v, softmax_scale=0.5),
        "softcap": lambda: flashtile.attention(q, k, v, softcap=2.0),
        "layout": lambda: flashtile.attention(q, k, v, layout="bhsd"),
        "deterministic": lambda: flashtile.attention(q, k, v, deterministic=True),
        "strides": lambda: flashtile.attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
        "shape": lambda: flashtile.attention(q[:, :5], k, v),
        "dtype": lambda: flashtile.attention(q.double(), k.double(), v.double()),
        "requires_grad": lambda: flashtile.attention(q.detach().requires_grad_(), k, v),
        "no_grad": lambda: _without_grad(lambda: flashtile.attention(q, k, v)),
    }


def _without_grad(fn):
    with torch.no_grad():
        return fn()


def test_each_change_the_checks_read_runs_them_again(checks):
    q, k, v = make_qkv(1, 11, 11, 2, 2, 16, storage="contiguous", requires_grad=False)
    flashtile.attention(q, k, v)
    for name, call in _variants(q, k, v).items():
        before = len(checks)
        call()
        assert len(checks) == before + 1, f"{name}: a changed call took the remembered checks"
        call()
        assert len(checks) == before + 1, f"{name}: its repeat ran the checks again"


def test_the_backend_switch_is_read_on_every_call(checks, monkeypatch):
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, requires_grad=False)
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    flashtile.attention(q, k, v)
    monkeypatch.setenv("FLASHTILE_BACKEND", "bogus")
    with pytest.raises(ValueError, match="FLASHTILE_BACKEND"):
        flashtile.attention(q, k, v)
    assert len(checks) == 2


@pytest.mark.parametrize("good, bad, error", [
    (dict(softmax_scale=1), dict(softmax_scale=True), TypeError),
    (dict(softcap=0), dict(softcap=False), ValueError),
    (dict(dropout_p=0), dict(dropout_p=False), ValueError),
    (dict(dropout_p=0.0), dict(dropout_p=torch.zeros(2)), ValueError),
    (dict(window_size=(1, -1)), dict(window_size=(True, -1)), ValueError),
    (dict(deterministic=True), dict(deterministic=1), TypeError),
], ids=["scale", "softcap", "dropout", "dropout-tensor", "window", "deterministic"])
def test_bad_input_equal_to_a_remembered_call_still_raises(good, bad, error):
    # True == 1 and hash(True) == hash(1): the key holds each option's type as well
    q, k, v = make_qkv(1, 6, 6, 2, 2, 16, requires_grad=False)
    flashtile.attention(q, k, v, **good)
    with pytest.raises(error):
        flashtile.attention(q, k, v, **bad)


def test_causal_is_remembered_only_as_a_bool(checks):
    # The checks read causal by its truth: a tensor given as causal can change after the call, a
    # list does not hash. Neither is kept, and each call answers as its causal says now.
    q, k, v = make_qkv(1, 7, 7, 2, 2, 16, requires_grad=False)
    flag = torch.tensor(True)
    masked = flashtile.attention(q, k, v, causal=flag)
    flag.fill_(False)
    assert torch.equal(flashtile.attention(q, k, v, causal=flag), flashtile.attention(q, k, v, causal=False))
    assert not torch.equal(masked, flashtile.attention(q, k, v, causal=False))
    assert torch.equal(flashtile.attention(q, k, v, causal=[1]), masked)
    assert len(checks) == 4 and len(call_cache._CHECKED) == 1  # the one bool call


def test_the_interpreter_switch_is_read_for_tensors_off_the_gpu(checks, monkeypatch):
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, requires_grad=False)
    flashtile.attention(q, k, v)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    flashtile.attention(q, k, v)
    assert len(checks) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device beside the CPU")
def test_the_same_call_on_another_device_is_checked_again(checks):
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, dtype=torch.float16, requires_grad=False)
    flashtile.attention(q, k, v)
    flashtile.attention(*(t.cuda() for t in (q, k, v)))
    assert len(checks) == 2


def test_a_window_that_may_become_a_block_mask_is_checked_every_time(checks, monkeypatch):
    # with grad, queries equal to keys, the kernels' backend: _band_block_mask's answer depends on the
    # Gluon switches and on CUDA-graph capture, which the key does not hold
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = (torch.randn(1, 24, 2, 16, device=DEVICE, dtype=torch.float16, requires_grad=True) for _ in range(3))
    for _ in range(2):
        flashtile.attention(q, k, v, causal=True, window_size=(5, -1))
    assert len(checks) == 2 and not call_cache._CHECKED


def test_calls_with_tensors_or_objects_beyond_q_k_v_are_not_remembered(checks):
    q, k, v = make_qkv(1, 6, 6, 2, 2, 16, requires_grad=False)
    for _ in range(2):
        flashtile.attention(q, k, v, bias=torch.zeros(1, 1, 6, 6))
        flashtile.attention(q, k, v, alibi_slopes=torch.ones(2))
        flashtile.attention(q, k, v, window_size=[2, 2])  # a list: the checks take it, a key does not
    assert len(checks) == 6
    assert not call_cache._CHECKED


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(call_cache, "_MAX_ENTRIES", 3)
    q, k, v = make_qkv(1, 6, 6, 2, 2, 16, requires_grad=False)
    for scale in (0.1, 0.2, 0.3, 0.4, 0.5):
        flashtile.attention(q, k, v, softmax_scale=scale)
        assert 1 <= len(call_cache._CHECKED) <= 3
