"""flashtile as a Hugging Face transformers attention backend (flashtile.integrations.transformers).

Tiny random-weight models built from configs, nothing downloaded: Llama, Mistral
(sliding window 8 over sequences of 20) and Qwen2 (a full layer, then a sliding one),
all with grouped-query attention (4 query heads, 2 KV heads). Logits are judged by the
numerical contract: the float64 oracle is eager attention on the same weights in
float64, the yardstick is ``sdpa`` in float32. Greedy ``generate`` must give sdpa's
tokens. Padding rows are left out of every comparison (no backend defines them).
The attention function is also checked alone, path by path, against naive_attention.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from flashtile import naive_attention
from flashtile.testing import assert_close_to_oracle

try:
    import transformers
except ImportError:  # the optional "hf" extra
    transformers = None
else:
    import flashtile.integrations.transformers as hf_backend

needs_hf = pytest.mark.skipif(transformers is None, reason="transformers is not installed: pip install 'flashtile[hf]'")
HAS_CUDA = torch.cuda.is_available()

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256, pad_token_id=0)
KINDS = ("llama", "mistral", "qwen2")
BATCH, SEQLEN, WINDOW = 3, 20, 8


def _config(kind: str):
    if kind == "llama":
        return transformers.LlamaConfig(**TINY)
    if kind == "mistral":
        return transformers.MistralConfig(**TINY, sliding_window=WINDOW)
    # Layers at index >= max_window_layers slide: layer 0 is full, layer 1 has the window.
    return transformers.Qwen2Config(**TINY, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices run fastest on one thread; several spin-wait for each other on a busy machine."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


_MODELS: dict = {}


def models(kind: str, device: str = "cpu"):
    """(flashtile float32, sdpa float32, eager float64) models sharing one set of random weights."""
    key = (kind, device)
    if key not in _MODELS:
        config = _config(kind)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            base = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
        built = {}
        for impl in (hf_backend.ATTN_IMPLEMENTATION, "sdpa", "eager"):
            model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
            model.load_state_dict(base.state_dict())
            built[impl] = model.to(device, torch.float64 if impl == "eager" else torch.float32).eval()
            assert model.config._attn_implementation == impl
        _MODELS[key] = (built[hf_backend.ATTN_IMPLEMENTATION], built["sdpa"], built["eager"])
    return _MODELS[key]


def padding_mask(padding: str, device="cpu") -> torch.Tensor | None:
    """(BATCH, SEQLEN) int64, 1 = token: row 0 full, rows 1 and 2 padded on the given side."""
    if padding == "none":
        return None
    mask = torch.ones(BATCH, SEQLEN, dtype=torch.long, device=device)
    for row, pads in ((1, 5), (2, 11)):  # row 2 keeps 9 tokens: more than the window
        if padding == "left":
            mask[row, :pads] = 0
        else:
            mask[row, SEQLEN - pads:] = 0
    return mask


def check_logits(kind: str, padding: str, device: str = "cpu") -> None:
    flash, sdpa, eager64 = models(kind, device)
    ids = torch.randint(1, TINY["vocab_size"], (BATCH, SEQLEN), device=device)
    mask = padding_mask(padding, device)
    with torch.no_grad():
        got, baseline, oracle = (m(input_ids=ids, attention_mask=mask).logits for m in (flash, sdpa, eager64))
    real = mask.bool() if mask is not None else torch.ones(BATCH, SEQLEN, dtype=torch.bool, device=device)
    assert torch.isfinite(got[real]).all()
    assert_close_to_oracle(f"{kind} logits, {padding} padding", got[real], oracle[real], baseline[real])


def greedy(model, ids, mask, new_tokens, **options):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, **options)
    return out[:, ids.shape[1]:]


def generate_prompts(padding: str, device="cpu"):
    mask = padding_mask(padding, device)
    if mask is None:
        mask = torch.ones(BATCH, SEQLEN, dtype=torch.long, device=device)
    ids = torch.randint(1, TINY["vocab_size"], (BATCH, SEQLEN), device=device).masked_fill(mask == 0, 0)
    return ids, mask


# -- the package -------------------------------------------------------------------------------------------------------

def test_importing_flashtile_does_not_import_transformers():
    code = ("import sys, flashtile, flashtile.integrations; "
            "sys.exit(1 if 'transformers' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@needs_hf
def test_register_is_idempotent_and_registers_function_and_mask():
    hf_backend.register()
    hf_backend.register()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS[hf_backend.ATTN_IMPLEMENTATION] is hf_backend.flashtile_attention_forward
    masking = pytest.importorskip("transformers.masking_utils", reason="transformers < 4.53 has no mask interface")
    assert (masking.ALL_MASK_ATTENTION_FUNCTIONS[hf_backend.ATTN_IMPLEMENTATION]
            is hf_backend.flashtile_attention_mask)


@needs_hf
def test_name_avoids_the_flash_substring_transformers_reserves():
    # transformers >= 5 treats any attn_implementation containing "flash" as a flash-attn
    # kernel to fetch from the Hub, and fails building the model; from_config must work.
    assert "flash" not in hf_backend.ATTN_IMPLEMENTATION
    model = transformers.AutoModelForCausalLM.from_config(_config("llama"),
                                                          attn_implementation=hf_backend.ATTN_IMPLEMENTATION)
    assert model.config._attn_implementation == hf_backend.ATTN_IMPLEMENTATION


# -- whole models, reference backend -----------------------------------------------------------------------------------

@needs_hf
@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_oracle(kind, padding, reference_backend):
    check_logits(kind, padding)


@needs_hf
@pytest.mark.parametrize("padding", ["none", "left"])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generate_matches_sdpa(kind, padding, reference_backend):
    flash, sdpa, _ = models(kind)
    ids, mask = generate_prompts(padding)
    assert torch.equal(greedy(flash, ids, mask, 8), greedy(sdpa, ids, mask, 8))


@needs_hf
@pytest.mark.parametrize("padding", ["none", "left"])
def test_greedy_generate_with_static_cache_matches_sdpa(padding, reference_backend):
    # A static cache hands the attention its whole buffer; the unwritten slots must stay unseen.
    flash, sdpa, _ = models("mistral")
    ids, mask = generate_prompts(padding)
    expected = greedy(sdpa, ids, mask, 6, cache_implementation="static")
    assert torch.equal(greedy(flash, ids, mask, 6, cache_implementation="static"), expected)


@needs_hf
def test_packed_sequences_in_one_row(reference_backend):
    # Padding-free batches: position_ids restart at each sequence, no mask, no cache.
    flash, sdpa, eager64 = models("mistral")
    lengths = (7, 10, 3)
    ids = torch.randint(1, TINY["vocab_size"], (1, sum(lengths)))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        got, baseline, oracle = (m(input_ids=ids, position_ids=position_ids, use_cache=False).logits
                                 for m in (flash, sdpa, eager64))
    assert_close_to_oracle("packed logits", got, oracle, baseline)


@needs_hf
def test_custom_4d_mask_is_used_as_given(reference_backend):
    flash, sdpa, eager64 = models("llama")
    ids = torch.randint(1, TINY["vocab_size"], (2, 12))
    allowed = torch.ones(12, 12).tril().bool() & (torch.rand(12, 12) > 0.3)
    allowed |= torch.eye(12, dtype=torch.bool)  # every row keeps a key
    bias = torch.zeros(2, 1, 12, 12).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        got, baseline = (m(input_ids=ids, attention_mask=bias).logits for m in (flash, sdpa))
        oracle = eager64(input_ids=ids, attention_mask=bias.double()).logits
    assert_close_to_oracle("4-d mask logits", got, oracle, baseline)


@needs_hf
def test_gradients_through_the_varlen_path(reference_backend):
    flash, sdpa, eager64 = models("mistral")
    ids = torch.randint(1, TINY["vocab_size"], (BATCH, SEQLEN))
    mask = padding_mask("left")
    weights = torch.randn(BATCH, SEQLEN, TINY["vocab_size"], dtype=torch.float64)
    grads = []
    for model in (flash, sdpa, eager64):
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        (logits * weights.to(logits.dtype) * mask[..., None]).sum().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert_close_to_oracle("q_proj grad", grads[0], grads[2], grads[1], grad=True)


@needs_hf
def test_paths_taken_and_kv_heads_not_repeated(monkeypatch, reference_backend):
    """generate with left padding: varlen for the prompt, the KV-cache decode for each new token.

    K/V reach the kernels as views of transformers' (B, Hkv, S, D) tensors: 2 KV heads, no repeat.
    """
    pytest.importorskip("transformers.masking_utils", reason="transformers < 4.53 builds 4-d masks: the bias path")
    calls = {"attention": 0, "varlen": 0, "kvcache": 0}

    def spy(name, fn, kv_arg):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            assert args[kv_arg].shape[-2] == TINY["num_key_value_heads"]
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(hf_backend, "attention", spy("attention", hf_backend.attention, 1))
    monkeypatch.setattr(hf_backend, "flash_attn_varlen_func", spy("varlen", hf_backend.flash_attn_varlen_func, 1))
    monkeypatch.setattr(hf_backend, "flash_attn_with_kvcache", spy("kvcache", hf_backend.flash_attn_with_kvcache, 1))
    flash, _, _ = models("llama")
    ids, mask = generate_prompts("left")
    greedy(flash, ids, mask, 4)
    layers = TINY["num_hidden_layers"]
    assert calls == {"attention": 0, "varlen": layers, "kvcache": 3 * layers}


# -- the attention function alone, path by path ------------------------------------------------------------------------

class _Module(torch.nn.Module):
    is_causal = True


def _expected(query, key, value, mask, window, upcast):
    """naive_attention with the padding mask as a bias: what sdpa computes, rows of nothing giving 0."""
    bias = torch.zeros(mask.shape, dtype=torch.float64 if upcast else query.dtype)
    bias = bias.masked_fill(~mask.bool(), float("-inf"))[:, None, None, :]
    out = naive_attention(query, key, value, causal=True, window_size=(window - 1, 0) if window else (-1, -1),
                          bias=bias, upcast=upcast, layout="bhsd")
    return out.transpose(1, 2)  # (B, Sq, Hq, D), as transformers wants it


@needs_hf
@pytest.mark.parametrize("case", [
    "decode-left-padding",      # flash_attn_with_kvcache with cache_leftpad
    "decode-trailing-padding",  # a hole: the varlen path, the one query kept
    "chunk-left-padding",       # 3 new queries over a padded cache: varlen, queries unpadded apart
    "static-cache-padding",     # mask shorter than K: K trimmed, then the decode path with cache_leftpad
    "static-cache-full",        # mask shorter than K, no padding: K trimmed, mask dropped
])
@pytest.mark.parametrize("window", [None, 4])
def test_attention_function_paths(case, window, reference_backend):
    batch, heads_q, heads_kv, headdim, seqlen_k = 3, 4, 2, 16, 12
    seqlen_q = {"chunk-left-padding": 3}.get(case, 1)
    query = torch.randn(batch, heads_q, seqlen_q, headdim)
    key, value = (torch.randn(batch, heads_kv, seqlen_k, headdim) for _ in range(2))
    mask = torch.ones(batch, seqlen_k, dtype=torch.bool)
    if case in ("decode-left-padding", "chunk-left-padding", "static-cache-padding"):
        mask[1, :4] = False
        mask[2, :7] = False
    if case == "decode-trailing-padding":
        mask[1, -1] = False  # the new token's own slot: the query is kept, as sdpa keeps it
        mask[2, 3:6] = False
        window = None  # with holes, windows count packed keys (as flash_attention_2 does): not sdpa's
    written = seqlen_k
    if case.startswith("static-cache"):
        written = 9  # slots 9.. of the static buffer are not written yet
        key[:, :, written:] = 1e4  # poison: any use shows
        mask = mask[:, :written]
    got, weights = hf_backend.flashtile_attention_forward(_Module(), query, key, value, mask, scaling=headdim**-0.5,
                                                          sliding_window=window)
    assert weights is None and got.shape == (batch, seqlen_q, heads_q, headdim)
    k, v = key[:, :, :written], value[:, :, :written]
    rows = mask[:, -seqlen_q:] if seqlen_q > 1 else torch.ones(batch, 1, dtype=torch.bool)
    oracle = _expected(query.double(), k.double(), v.double(), mask, window, True)
    baseline = _expected(query, k, v, mask, window, False)
    assert_close_to_oracle(case, got[rows], oracle[rows], baseline[rows])


@needs_hf
def test_attention_function_takes_cu_seqlens_kwargs(reference_backend):
    # transformers' DataCollatorWithFlattening passes the packed layout as kwargs.
    lengths, heads, headdim = (5, 9, 2), 4, 16
    total = sum(lengths)
    query, key, value = (torch.randn(1, heads, total, headdim) for _ in range(3))
    cu = torch.tensor([0, 5, 14, 16], dtype=torch.int32)
    got, _ = hf_backend.flashtile_attention_forward(_Module(), query, key, value, None, cu_seq_lens_q=cu,
                                                    cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    segment = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    same = segment[:, None] == segment[None, :]

    def expected(dtype, upcast):
        bias = torch.zeros(total, total, dtype=dtype).masked_fill(~same, float("-inf"))
        out = naive_attention(query.to(dtype), key.to(dtype), value.to(dtype), causal=True, bias=bias,
                              upcast=upcast, layout="bhsd")
        return out.transpose(1, 2)

    assert_close_to_oracle("cu_seqlens kwargs", got, expected(torch.float64, True), expected(torch.float32, False))


# -- Triton kernels (the interpreter on a CPU machine; the GPU when there is one) --------------------------------------

@needs_hf
@pytest.mark.parametrize("kind,padding", [("mistral", "left"), ("qwen2", "right")])
def test_logits_match_oracle_triton(kind, padding, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    check_logits(kind, padding, "cuda" if HAS_CUDA else "cpu")


@needs_hf
def test_greedy_generate_matches_sdpa_triton(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    device = "cuda" if HAS_CUDA else "cpu"
    flash, sdpa, _ = models("mistral", device)
    ids, mask = generate_prompts("left", device)
    assert torch.equal(greedy(flash, ids, mask, 3), greedy(sdpa, ids, mask, 3))


@needs_hf
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_on_gpu(kind, dtype, monkeypatch):
    """On the GPU in half precision, the logits by the contract."""
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    flash, sdpa, eager64 = models(kind, "cuda")
    flash, sdpa = copy.deepcopy(flash).to(dtype), copy.deepcopy(sdpa).to(dtype)
    ids = torch.randint(1, TINY["vocab_size"], (BATCH, SEQLEN), device="cuda")
    mask = padding_mask("left", "cuda")
    with torch.no_grad():
        got, baseline, oracle = (m(input_ids=ids, attention_mask=mask).logits for m in (flash, sdpa, eager64))
    real = mask.bool()
    assert_close_to_oracle(f"{kind} {dtype} logits", got[real], oracle[real], baseline[real])
