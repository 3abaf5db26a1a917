"""User-defined score modifiers (score_mod) on both backends, against the float64 oracle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flashtile
from flashtile.mask_mods import causal_mask
from flashtile.score_mods import alibi_score, softcap_score
from flashtile.testing import assert_close_to_oracle
from helpers import assert_grads_match_oracle

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def relative_position(score, b, h, q_idx, kv_idx):
    # A T5-like relative bias that also differs per head and per batch entry.
    return score + 0.05 * (kv_idx - q_idx) - 0.1 * h + 0.2 * b


def quadratic(score, b, h, q_idx, kv_idx):
    # Nonlinear in the score, so the backward really uses the derivative below.
    return score * score * 0.25 + score


def quadratic_grad(score, b, h, q_idx, kv_idx):
    return score * 0.5 + 1.0


def mask_far_keys(score, b, h, q_idx, kv_idx):
    # -inf from a score_mod masks, as in FlexAttention; every row keeps its own key.
    return torch.where(q_idx - kv_idx > 6, float("-inf"), score)


MODS = {  # name -> factory(heads_q)
    "relative": lambda heads: flashtile.score_mod(relative_position, grad=1.0),
    "quadratic": lambda heads: flashtile.score_mod(quadratic, grad=quadratic_grad),
    "softcap": lambda heads: softcap_score(2.5),
    "alibi": lambda heads: alibi_score(torch.rand(heads, device=DEVICE) * 0.5),
}


def check_score_mod(mod, seqlen_q=19, seqlen_k=23, heads_q=4, heads_kv=2, headdim=24, batch=2, layout="bshd",
                    dtype=torch.float32, **options):
    shape = (lambda s, h: (batch, s, h, headdim)) if layout == "bshd" else (lambda s, h: (batch, h, s, headdim))
    q = torch.randn(shape(seqlen_q, heads_q), device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(shape(seqlen_k, heads_kv), device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(shape(seqlen_k, heads_kv), device=DEVICE, dtype=dtype, requires_grad=True)
    out = flashtile.attention(q, k, v, score_mod=mod, layout=layout, **options)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_grads_match_oracle(out, grads, q, k, v, dout, score_mod=mod, layout=layout, **options)


@pytest.mark.parametrize("name", list(MODS))
def test_score_mod_matches_oracle(backend, name):
    check_score_mod(MODS[name](4), causal=True)



@pytest.mark.parametrize("view", ["every-other", "expanded"])
def test_alibi_slopes_as_a_strided_or_expanded_view(backend, view):
    # The kernels read buffer[h] at buffer + h: before the slopes were made contiguous
    # these views gave other slopes on the Triton path (max error 2-22), or read past the storage.
    slopes = (torch.rand(8, device=DEVICE)[::2] if view == "every-other"
              else torch.full((1,), 0.3, device=DEVICE).expand(4))
    assert slopes.stride(0) != 1
    check_score_mod(alibi_score(slopes), causal=True)

@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_score_mod_odd_sizes_both_layouts(backend, layout):
    mod = MODS["quadratic"](4)
    check_score_mod(mod, seqlen_q=1, seqlen_k=17, headdim=40, layout=layout)
    check_score_mod(mod, seqlen_q=17, seqlen_k=1, heads_q=2, heads_kv=2, headdim=16, layout=layout)


def test_score_mod_with_softcap_alibi_bias_and_mask(backend):
    # Order: scale, softcap, ALiBi, score_mod, bias, masks; each derivative chains.
    bias = torch.randn(1, 4, 1, 23, device=DEVICE)
    check_score_mod(MODS["quadratic"](4), softcap=3.0, alibi_slopes=torch.rand(4, device=DEVICE) * 0.3,
                    bias=bias, window_size=(5, 0))


def test_score_mod_that_masks_with_minus_inf(backend):
    check_score_mod(flashtile.score_mod(mask_far_keys, grad=1.0), seqlen_q=23, seqlen_k=23)


def test_score_mod_with_mask_mod(backend):
    q, k, v = (torch.randn(1, 21, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    mod = MODS["relative"](2)
    out = flashtile.attention(q, k, v, score_mod=mod, mask_mod=causal_mask())
    ref = flashtile.naive_attention(q, k, v, score_mod=mod, causal=True)
    assert_close_to_oracle("out", out, ref, flashtile.naive_attention(q, k, v, score_mod=mod, causal=True,
                                                                      upcast=False))


def test_softcap_score_equals_builtin_softcap(backend):
    q, k, v = (torch.randn(2, 13, 2, 16, device=DEVICE) for _ in range(3))
    a = flashtile.attention(q, k, v, score_mod=softcap_score(1.5), causal=True)
    b = flashtile.attention(q, k, v, softcap=1.5, causal=True)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_wrong_grad_is_refused():
    with pytest.raises(ValueError, match=r"^score_mod grad: does not match the derivative of 'quadratic'"):
        flashtile.score_mod(quadratic, grad=1.0)


def test_missing_grad_is_a_clear_error_on_the_kernels(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = (torch.randn(1, 5, 1, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    with pytest.raises(ValueError, match=r"^score_mod: 'quadratic' has no derivative for the Triton kernels"):
        flashtile.attention(q, k, v, score_mod=quadratic)
    with torch.no_grad():  # no gradient needed: the forward runs
        out = flashtile.attention(q, k, v, score_mod=quadratic)
    ref = flashtile.naive_attention(q, k, v, score_mod=quadratic)
    assert_close_to_oracle("out", out, ref, flashtile.naive_attention(q, k, v, score_mod=quadratic, upcast=False))


def test_reference_backend_differentiates_a_plain_function(reference_backend):
    # Without grad=, the reference backend takes the derivative from torch.func.
    check_score_mod(quadratic, causal=True)


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match=r"^score_mod: expected a function"):
        flashtile.score_mod(3)
    with pytest.raises(TypeError, match=r"^grad: expected a function"):
        flashtile.score_mod(quadratic, grad="one")
    with pytest.raises(ValueError, match=r"^softcap: expected a number > 0"):
        softcap_score(0)
    with pytest.raises(TypeError, match=r"^slopes: expected a 1-d float32 tensor"):
        alibi_score(torch.ones(2, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODS))
def test_gpu_score_mod(name, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    for dtype in (torch.bfloat16, torch.float16):
        check_score_mod(MODS[name](8), seqlen_q=700, seqlen_k=1000, heads_q=8, heads_kv=2, headdim=64, dtype=dtype,
                        causal=True)


KEY_SCRIPT = """
import flashtile
from flashtile.mask_mods import mask_mod

def make_score(c):
    def add(score, b, h, q_idx, kv_idx):
        return score + c * (kv_idx - q_idx)
    return add

def make_mask(w):
    def near(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= w
    return near

keys = [flashtile.score_mod(make_score(c), grad=1.0).triton_fns()[0].cache_key for c in (0.5, -3.0)]
keys += [mask_mod(make_mask(w)).triton_fn().cache_key for w in (2, 9)]
print(" ".join(keys))
"""


def test_closures_with_other_values_get_their_own_kernels(tmp_path):
    # Triton keys compiled kernels by source text; two modifiers from one factory differ only
    # in closure values, so without a token of their own the second would reuse the first's
    # kernel (its constants compiled in). The keys are Triton's own, outside the interpreter.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(flashtile.__file__).parents[1]), env.get("PYTHONPATH", "")])
    script = tmp_path / "keys.py"  # a file: triton.jit reads the functions' source
    script.write_text(KEY_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    score_a, score_b, mask_a, mask_b = done.stdout.split()
    assert score_a != score_b and mask_a != mask_b


def test_a_plain_function_is_wrapped_once():
    assert flashtile.score_mod(quadratic) is flashtile.score_mod(quadratic)

    class Scale:  # a callable without a __dict__ slot for the cache: wrapped on each call, still works
        __slots__ = ()

        def __call__(self, score, b, h, q_idx, kv_idx):
            return score * 0.5

    assert isinstance(flashtile.score_mod(Scale()), flashtile.ScoreMod)


def test_grad_with_a_score_mod_is_refused():
    with pytest.raises(ValueError, match=r"^grad: 'softcap_2_0' is already a ScoreMod"):
        flashtile.score_mod(softcap_score(2.0), grad=1.0)


def test_alibi_score_needs_one_slope_per_query_head():
    q, k, v = (torch.randn(1, 5, 4, 16, device=DEVICE) for _ in range(3))
    with pytest.raises(ValueError, match=r"^score_mod: 'alibi' holds 3 per-head values, expected one per query "
                                         r"head \(4\)"):
        flashtile.attention(q, k, v, score_mod=alibi_score(torch.rand(3, device=DEVICE)))


def test_bias_gradient_also_needs_the_derivative(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = (torch.randn(1, 5, 1, 16, device=DEVICE) for _ in range(3))
    bias = torch.zeros(1, 1, 5, 5, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match=r"^score_mod: 'quadratic' has no derivative for the Triton kernels"):
        flashtile.attention(q, k, v, bias=bias, score_mod=quadratic)
