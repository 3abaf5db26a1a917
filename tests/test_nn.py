"""flashtile.nn: the attention layer and rotary embeddings against independent math.

The layer is checked against a re-implementation written here from the formulas:
projections as plain matmuls, rotary as multiplication by complex numbers e^{i·p·θ}
(not the module's cos/sin code), attention by the naive oracle. The float64 run is
the truth; the same re-implementation in the input dtype is PyTorch's yardstick for
the numerical contract (DESIGN.md), for the output and every gradient.
"""

import io

import pytest
import torch

import flashtile
import flashtile.nn as ftnn
from flashtile.testing import assert_close_to_oracle, max_error

pytestmark = pytest.mark.usefixtures("reference_backend")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The tiled reference runs many small matmuls; on a busy 2-core machine two intra-op
    # threads wait on each other in every one of them (seconds per backward, measured),
    # while one thread takes milliseconds. Results are the same either way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

BATCH, SEQLEN, EMBED, HEADS, HEAD_DIM = 2, 70, 64, 4, 16  # 70 > 64: two query/key tiles in the reference


# -- independent formulas


def rotary_complex(x: torch.Tensor, *, base: float, interleaved: bool, rotary_dim: int, offset: int = 0):
    """RoPE from its definition: pair j of position p, as a complex number, times e^{i·p·base^(−2j/r)}.

    x: (B, S, H, D) -> float64 (B, S, H, D).
    """
    x = x.double()
    part, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        re, im = part[..., 0::2], part[..., 1::2]
    else:
        re, im = part[..., : rotary_dim // 2], part[..., rotary_dim // 2:]
    positions = torch.arange(offset, offset + x.shape[1], dtype=torch.float64)
    theta = base ** (-2.0 * torch.arange(rotary_dim // 2, dtype=torch.float64) / rotary_dim)
    angles = torch.outer(positions, theta)
    z = torch.complex(re, im) * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    if interleaved:
        part = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    else:
        part = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((part, rest), dim=-1)


def layer_by_hand(x, params: dict, cfg: dict, *, upcast: bool):
    """The Attention layer from the formulas, in float64 (upcast) or in x's dtype."""
    dtype = torch.float64 if upcast else x.dtype
    p = {name: t.to(dtype) for name, t in params.items()}
    x = x.to(dtype)
    h, h_kv, d = cfg["num_heads"], cfg["num_kv_heads"], HEAD_DIM
    qkv = x @ p["qkv_proj.weight"].T
    if "qkv_proj.bias" in p:
        qkv = qkv + p["qkv_proj.bias"]
    q = qkv[..., : h * d].unflatten(-1, (h, d))
    k = qkv[..., h * d: (h + h_kv) * d].unflatten(-1, (h_kv, d))
    v = qkv[..., (h + h_kv) * d:].unflatten(-1, (h_kv, d))
    if cfg.get("rope_base") is not None:
        rotary = dict(base=cfg["rope_base"], interleaved=cfg.get("rope_interleaved", False),
                      rotary_dim=cfg.get("rotary_dim") or d)
        q, k = rotary_complex(q, **rotary).to(dtype), rotary_complex(k, **rotary).to(dtype)
    out = flashtile.naive_attention(q, k, v, causal=cfg.get("causal", False),
                                    window_size=cfg.get("window_size", (-1, -1)), upcast=upcast)
    out = out.flatten(2) @ p["out_proj.weight"].T
    if "out_proj.bias" in p:
        out = out + p["out_proj.bias"]
    return out


def output_and_grads(fn, x, params: dict, dout):
    """fn(x, params) -> out; returns [out, dx, d(param) for each param], all detached."""
    x = x.detach().clone().requires_grad_()
    params = {n: t.detach().clone().requires_grad_() for n, t in params.items()}
    out = fn(x, params)
    grads = torch.autograd.grad((out * dout.to(out.dtype)).sum(), [x, *params.values()])
    return [out.detach(), *grads]


def module_fn(module):
    def run(x, params):
        return torch.func.functional_call(module, params, (x,))
    return run


# -- the layer against the formulas

CASES = {
    "mha-causal-halfsplit": dict(num_heads=4, num_kv_heads=4, causal=True, rope_base=10_000.0),
    "gqa-interleaved-biases": dict(num_heads=4, num_kv_heads=2, rope_base=500.0, rope_interleaved=True,
                                   qkv_bias=True, out_bias=True),
    "mqa-window-norope": dict(num_heads=4, num_kv_heads=1, causal=True, window_size=(16, 0), rope_base=None),
    "gqa-partial-rotary": dict(num_heads=4, num_kv_heads=2, causal=True, rope_base=10_000.0, rotary_dim=8),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_layer_matches_formulas_forward_and_backward(case, dtype):
    cfg = CASES[case]
    module = ftnn.Attention(EMBED, head_dim=HEAD_DIM, dtype=dtype, **cfg)
    with torch.no_grad():  # nn.Linear zero-initialises nothing, but make biases visibly non-zero
        for name, t in module.named_parameters():
            if name.endswith("bias"):
                t.normal_()
    params = dict(module.named_parameters())
    x = torch.randn(BATCH, SEQLEN, EMBED, dtype=dtype)
    dout = torch.randn(BATCH, SEQLEN, EMBED, dtype=dtype)

    ours = output_and_grads(module_fn(module), x, params, dout)
    truth = output_and_grads(lambda x_, p_: layer_by_hand(x_, p_, cfg, upcast=True), x.double(),
                             {n: t.double() for n, t in params.items()}, dout.double())
    base = output_and_grads(lambda x_, p_: layer_by_hand(x_, p_, cfg, upcast=False), x, params, dout)

    assert truth[0].abs().max() > 0
    names = ["out", "dx", *(f"d[{n}]" for n in params)]
    for i, name in enumerate(names):
        assert ours[i].dtype == dtype, f"{name}: dtype {ours[i].dtype}"
        assert_close_to_oracle(f"{case}/{name}", ours[i], truth[i], base[i], grad=i > 0)


def test_layer_reads_projection_in_place(monkeypatch):
    # flashtile.attention must receive views of the projection output, in "bshd":
    # no reshape copy. With rotary off, q, k and v all live in that one storage.
    module = ftnn.Attention(EMBED, HEADS, num_kv_heads=2, rope_base=None)
    projected, seen = [], []
    module.qkv_proj.register_forward_hook(lambda _m, _i, out: projected.append(out))

    def spy(q, k, v, **kwargs):
        seen.append((q, k, v))
        return flashtile.attention(q, k, v, **kwargs)

    monkeypatch.setattr(ftnn, "attention", spy)
    module(torch.randn(BATCH, SEQLEN, EMBED))
    (q, k, v), storage = seen[0], projected[0].untyped_storage().data_ptr()
    assert q.shape == (BATCH, SEQLEN, HEADS, HEAD_DIM) and k.shape == v.shape == (BATCH, SEQLEN, 2, HEAD_DIM)
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.untyped_storage().data_ptr() == storage, f"{name} was copied out of the projection"
        assert t.stride(-1) == 1


def test_grouped_heads_follow_flash_attn_convention():
    # Query head h uses KV head h // (H / H_kv): a GQA layer equals a full multi-head
    # layer whose K/V weights repeat each KV head for its group of query heads.
    gqa = ftnn.Attention(EMBED, HEADS, num_kv_heads=2, causal=True)
    mha = ftnn.Attention(EMBED, HEADS, num_kv_heads=HEADS, causal=True)
    q_w, k_w, v_w = gqa.qkv_proj.weight.detach().split((HEADS * HEAD_DIM, 2 * HEAD_DIM, 2 * HEAD_DIM))
    repeat = lambda w: w.unflatten(0, (2, HEAD_DIM)).repeat_interleave(HEADS // 2, dim=0).flatten(0, 1)  # noqa: E731
    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat((q_w, repeat(k_w), repeat(v_w))))
        mha.out_proj.weight.copy_(gqa.out_proj.weight)
    x = torch.randn(BATCH, SEQLEN, EMBED)
    gqa_out, mha_out = gqa(x), mha(x)
    assert gqa_out.abs().max() > 0
    assert max_error(gqa_out, mha_out) < 1e-5


def test_state_dict_round_trip():
    module = ftnn.Attention(EMBED, HEADS, num_kv_heads=2, causal=True, qkv_bias=True)
    assert set(module.state_dict()) == {"qkv_proj.weight", "qkv_proj.bias", "out_proj.weight"}, (
        "the rotary cache must not be saved: it depends on max_seqlen, not on training"
    )
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    # A fresh layer with other random weights and a short rotary cache (it must grow to 70).
    restored = ftnn.Attention(EMBED, HEADS, num_kv_heads=2, causal=True, qkv_bias=True, max_seqlen=16)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    x = torch.randn(BATCH, SEQLEN, EMBED)
    assert torch.equal(module(x), restored(x))

    other_heads = ftnn.Attention(EMBED, HEADS, num_kv_heads=1, causal=True, qkv_bias=True)
    with pytest.raises(RuntimeError, match="size mismatch"):
        other_heads.load_state_dict(module.state_dict())


# -- rotary embeddings


@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 10])
def test_rotary_matches_complex_formula(interleaved, rotary_dim):
    rope = ftnn.RotaryEmbedding(rotary_dim, base=10_000.0, interleaved=interleaved, max_seqlen=8)
    x = torch.randn(BATCH, 40, 3, 16)
    for offset in (0, 1000):  # 1000 also makes the cache grow from 8 entries
        expected = rotary_complex(x, base=10_000.0, interleaved=interleaved, rotary_dim=rotary_dim, offset=offset)
        got = rope(x, offset=offset)
        assert got.dtype == x.dtype
        # float32 cos/sin and arithmetic: a few float32 ulps of |x| ≤ ~5.
        assert max_error(got, expected) < 1e-5, f"offset {offset}"
        if rotary_dim < 16:
            assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:]), "channels past rotary_dim must pass through"


def test_rotary_scores_depend_on_relative_position_only():
    # RoPE's defining property: <R(m) q, R(n) k> is a function of m − n.
    rope = ftnn.RotaryEmbedding(32, interleaved=False)
    q, k = torch.randn(1, 1, 1, 32, dtype=torch.float64), torch.randn(1, 1, 1, 32, dtype=torch.float64)
    score = lambda m, n: float((rope(q, offset=m) * rope(k, offset=n)).sum())  # noqa: E731
    assert score(7, 3) == pytest.approx(score(107, 103), abs=1e-5)
    assert score(7, 3) == pytest.approx(score(1004, 1000), abs=1e-5)
    assert score(7, 3) != pytest.approx(score(3, 7), abs=1e-3), "scores should depend on the sign of m − n"


def test_rotary_conventions_are_a_channel_permutation():
    # interleaved(x) equals half-split applied to the channels reordered (evens, then odds).
    x = torch.randn(2, 9, 3, 16)
    perm = torch.cat((torch.arange(0, 16, 2), torch.arange(1, 16, 2)))
    half = ftnn.RotaryEmbedding(16, interleaved=False)(x[..., perm])
    inter = ftnn.RotaryEmbedding(16, interleaved=True)(x)
    assert torch.equal(half, inter[..., perm])
    assert not torch.equal(half, ftnn.RotaryEmbedding(16, interleaved=False)(x)[..., perm])


def test_rotary_cache_survives_module_dtype_cast():
    # model.to(torch.bfloat16) casts every float buffer; the cos/sin cache must come back
    # in float32, or positions would be rotated by bfloat16-rounded angles.
    rope = ftnn.RotaryEmbedding(16).to(torch.bfloat16)
    x = torch.randn(1, 300, 2, 16)
    expected = rotary_complex(x, base=10_000.0, interleaved=False, rotary_dim=16)
    assert max_error(rope(x), expected) < 1e-5


def test_rotary_keeps_half_precision_dtype():
    x = torch.randn(1, 5, 2, 8, dtype=torch.bfloat16)
    out = ftnn.RotaryEmbedding(8)(x)
    assert out.dtype == torch.bfloat16
    # computed in float32 and rounded once: within one bfloat16 rounding of the truth
    assert max_error(out, rotary_complex(x, base=10_000.0, interleaved=False, rotary_dim=8)) < 2 ** -7 * 4


# -- errors name the argument


@pytest.mark.parametrize("kwargs, match", [
    (dict(embed_dim=60, num_heads=8), "embed_dim"),
    (dict(embed_dim=64, num_heads=4, num_kv_heads=3), "num_kv_heads"),
    (dict(embed_dim=64, num_heads=4, rotary_dim=32), "rotary_dim"),
    (dict(embed_dim=64, num_heads=4, rotary_dim=7), "rotary_dim"),
    (dict(embed_dim=0, num_heads=4), "embed_dim"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ftnn.Attention(**kwargs)


def test_bad_input_shape_raises():
    module = ftnn.Attention(EMBED, HEADS)
    with pytest.raises(ValueError, match=r"x: expected \(batch, seqlen, 64\)"):
        module(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="x: expected"):
        module(torch.randn(5, EMBED))


def test_rotary_tables_must_cover_every_position():
    # One row of cos/sin broadcast silently over 11 positions before this check.
    x = torch.randn(2, 11, 4, 16)
    cos, sin = torch.ones(1, 8), torch.zeros(1, 8)
    with pytest.raises(ValueError, match=r"^cos: expected shape \(seqlen, rotary_dim // 2\) = \(11, 8\), got \(1, 8\)"):
        ftnn.apply_rotary(x, cos, sin)
    with pytest.raises(ValueError, match=r"^sin: expected shape"):
        ftnn.apply_rotary(x, torch.ones(11, 8), torch.zeros(11, 4))
