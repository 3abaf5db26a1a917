"""flash_attn_with_kvcache: in-place append, rotary, paged and contiguous caches,
split-KV decoding, against the float64 oracle over the cache each sequence sees."""

from __future__ import annotations

import pytest
import torch

import flashtile
from flashtile.testing import assert_close_to_oracle, max_error

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", request.param)
    return request.param


def plain_rotary(x, cos, sin, positions, interleaved):
    """RoPE via complex multiplication: an implementation independent of flashtile.rotary."""
    r = 2 * cos.shape[1]
    xr = x[..., :r].double()
    pairs = xr.unflatten(-1, (r // 2, 2)) if interleaved else torch.stack(xr.chunk(2, dim=-1), dim=-1)
    z = torch.view_as_complex(pairs.contiguous())
    angle = torch.polar(torch.ones_like(cos.double()), torch.atan2(sin.double(), cos.double()))[positions][:, :, None]
    w = torch.view_as_real(z * angle)
    rotated = w.flatten(-2) if interleaved else torch.cat((w[..., 0], w[..., 1]), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., r:]), dim=-1)


def rope_tables(max_pos, rotary_dim, device=DEVICE):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device=device).float() / rotary_dim))
    angles = torch.arange(max_pos, device=device).float()[:, None] * inv[None]
    return angles.cos(), angles.sin()


def run_case(*, batch=3, seqlen_q=1, heads_q=4, heads_kv=2, headdim=32, capacity=80, seqlen_new=1, paged=False,
             page_size=16, batch_idx=False, leftpad=False, rotary=None, num_splits=0, dtype=torch.float32,
             alibi=False, strided_index=False, lengths=None, head_major_new=False, **options):
    """One call against the oracle; ``strided_index``: the index tensors are passed as views
    with stride 2 in their last dim (every other element of a wider buffer). ``lengths``:
    the cache's lengths before the append (default: random, the first cache full).
    ``head_major_new``: the new k and v are (B, Hkv, S_new, D) tensors seen transposed."""
    torch.manual_seed(1)  # the same inputs on every call, so calls can be compared
    g = torch.Generator(device="cpu").manual_seed(0)
    if lengths is None:
        lengths = torch.randint(0, capacity - seqlen_new + 1, (batch,), generator=g).to(torch.int32)
        lengths[0] = capacity - seqlen_new  # one full cache
    else:
        lengths = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(batch, seqlen_q, heads_q, headdim, dtype=dtype, device=DEVICE)
    new_shape = (batch, heads_kv, seqlen_new, headdim) if head_major_new else (batch, seqlen_new, heads_kv, headdim)
    k_new, v_new = ((torch.randn(new_shape, dtype=dtype, device=DEVICE) for _ in range(2)) if seqlen_new
                    else (None, None))
    if seqlen_new and head_major_new:
        k_new, v_new = k_new.transpose(1, 2), v_new.transpose(1, 2)
    rows = batch + 2 if batch_idx else batch
    logical_k = torch.randn(rows, capacity, heads_kv, headdim, dtype=dtype, device=DEVICE)
    logical_v = torch.randn_like(logical_k)
    cache_batch_idx = torch.randperm(rows, generator=g)[:batch].to(torch.int32).to(DEVICE) if batch_idx else None
    cache_leftpad = (torch.minimum(lengths, torch.randint(0, 9, (batch,), generator=g).to(torch.int32)).to(DEVICE)
                     if leftpad else None)
    cache_seqlens = lengths.to(DEVICE)
    cos = sin = None
    if rotary is not None:
        cos, sin = rope_tables(capacity + seqlen_q, rotary[0])

    # What the cache must hold after the call, built by hand.
    expected_k, expected_v = logical_k.clone(), logical_v.clone()
    k_rot = k_new
    if seqlen_new:
        if rotary is not None:
            pos = cache_seqlens.long()[:, None] + torch.arange(seqlen_new, device=DEVICE)
            k_rot = plain_rotary(k_new, cos, sin, pos, rotary[1])
        cache_rows = cache_batch_idx.long() if batch_idx else torch.arange(batch, device=DEVICE)
        for b in range(batch):
            start = int(lengths[b])
            expected_k[cache_rows[b], start:start + seqlen_new] = k_rot[b]
            expected_v[cache_rows[b], start:start + seqlen_new] = v_new[b]

    if paged:  # scatter the logical cache over shuffled pages
        pages_per_seq = capacity // page_size
        num_blocks = rows * pages_per_seq + 3
        perm = torch.randperm(num_blocks, generator=g)[: batch * pages_per_seq].to(DEVICE)
        block_table = perm.view(batch, pages_per_seq).to(torch.int32)
        k_cache = torch.randn(num_blocks, page_size, heads_kv, headdim, dtype=dtype, device=DEVICE)
        v_cache = torch.randn_like(k_cache)
        k_cache[block_table.long()] = logical_k[:batch].unflatten(1, (pages_per_seq, page_size))
        v_cache[block_table.long()] = logical_v[:batch].unflatten(1, (pages_per_seq, page_size))
    else:
        block_table = None
        k_cache, v_cache = logical_k.clone(), logical_v.clone()
    slopes = torch.rand(batch, heads_q, device=DEVICE) if alibi else None

    index = dict(cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                 block_table=block_table)
    if strided_index:  # the wider buffer's other elements are zeros: valid indices, wrong answers
        index = {name: None if t is None else torch.stack([t, torch.zeros_like(t)], -1)[..., 0]
                 for name, t in index.items()}
        assert all(t is None or t.stride(-1) == 2 for t in index.values())
    out, lse = flashtile.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, **index,
        rotary_interleaved=rotary[1] if rotary else True, num_splits=num_splits, alibi_slopes=slopes,
        return_softmax_lse=True, **options)

    # In-place append, checked element by element (and nothing else touched). Rotated keys
    # come from two implementations of RoPE, so they agree to rounding, not bit for bit.
    if paged:
        got_k = k_cache[block_table.long()].flatten(1, 2)
        got_v = v_cache[block_table.long()].flatten(1, 2)
        expected_k, expected_v = expected_k[:batch], expected_v[:batch]
    else:
        got_k, got_v = k_cache, v_cache
    assert torch.equal(got_v, expected_v)
    if rotary is None:
        assert torch.equal(got_k, expected_k)
    else:
        assert max_error(got_k, expected_k) < (1e-2 if dtype != torch.float32 else 1e-5)
        untouched = (got_k == expected_k).float().mean()
        assert untouched > 0.5, "the cache outside the appended tokens must be left as it was"

    # The oracle: each sequence attends over its (left-padded) cache, q rotated like flash-attn.
    q_ref = q
    if rotary is not None:
        base = cache_seqlens.long()[:, None]
        causal_or_local = options.get("causal") or options.get("window_size", (-1, -1)) != (-1, -1)
        pos = base + torch.arange(seqlen_q, device=DEVICE) if causal_or_local else base.expand(batch, seqlen_q)
        q_ref = plain_rotary(q, cos, sin, pos, rotary[1])
    refs, pts, lses = [], [], []
    for b in range(batch):
        row = int(cache_batch_idx[b]) if batch_idx else b
        start = int(cache_leftpad[b]) if leftpad else 0
        end = int(lengths[b]) + seqlen_new
        keys, values = expected_k[row, start:end][None], expected_v[row, start:end][None]
        sl = slopes[b] if alibi else None
        if end == start:
            refs.append(torch.zeros(seqlen_q, heads_q, headdim, dtype=torch.float64, device=DEVICE))
            pts.append(torch.zeros(seqlen_q, heads_q, headdim, dtype=dtype, device=DEVICE))
            lses.append(torch.full((heads_q, seqlen_q), float("-inf"), dtype=torch.float64, device=DEVICE))
            continue
        o, lse_b = flashtile.naive_attention(q_ref[b:b + 1], keys, values, alibi_slopes=sl, return_lse=True,
                                             **options)
        refs.append(o[0])
        lses.append(lse_b[0])
        pts.append(flashtile.naive_attention(q_ref[b:b + 1], keys, values, alibi_slopes=sl, upcast=False,
                                             **options)[0])
    assert_close_to_oracle("out", out, torch.stack(refs), torch.stack(pts))
    assert max_error(lse, torch.stack(lses)) < 1e-4
    return out


CASES = {
    "decode-causal": dict(causal=True),
    "decode-paged": dict(paged=True, causal=True),
    "prefill-chunk": dict(seqlen_q=5, seqlen_new=5, causal=True, paged=True, page_size=32, capacity=96),
    "no-append": dict(seqlen_new=0, seqlen_q=2),
    "batch-idx-leftpad": dict(batch_idx=True, leftpad=True, causal=True),
    "rotary-interleaved": dict(rotary=(16, True), causal=True),
    "rotary-halves-noncausal": dict(rotary=(32, False)),
    "window-softcap-alibi-mqa": dict(heads_kv=1, window_size=(20, 0), softcap=5.0, alibi=True),
    "splits-3": dict(num_splits=3, causal=True, paged=True),
    # New tokens that cross a page boundary (positions 13-17 and 30-34 over pages of 16),
    # from k and v laid out head-major: the append reads their strides.
    "append-across-pages": dict(paged=True, seqlen_q=5, seqlen_new=5, lengths=[75, 13, 30], head_major_new=True,
                                causal=True),
    # Pages of several key tiles (48 = 3 x 16 under the interpreter) with splits and a left
    # window edge that start mid-page: the kernel walks a page's tiles in an inner loop.
    "pages-of-three-tiles-window-splits": dict(paged=True, page_size=48, capacity=96, num_splits=3, causal=True,
                                               window_size=(37, 0)),
    # Index tensors as strided views: the kernel reads entry b at index + b (it read the
    # wrong entries before the API made them contiguous).
    "strided-index-paged-leftpad": dict(paged=True, leftpad=True, causal=True, strided_index=True, num_splits=2),
    "strided-index-batch-idx": dict(batch_idx=True, leftpad=True, strided_index=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kvcache_matches_oracle(backend, name):
    run_case(**CASES[name])


def test_every_num_splits_equals_no_split(backend):
    outs = [run_case(num_splits=n, causal=True, capacity=96) for n in (1, 2, 3, 7)]
    for o in outs[1:]:
        assert max_error(o, outs[0]) < 1e-5


def test_paged_equals_contiguous(backend):
    a = run_case(paged=False, causal=True, seqlen_q=2, seqlen_new=2)
    b = run_case(paged=True, causal=True, seqlen_q=2, seqlen_new=2)
    assert max_error(a, b) < 1e-5


def test_float16_on_the_kernels(monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    run_case(dtype=torch.float16, causal=True, paged=True)


def test_rotary_matches_plain_formula():
    from flashtile.rotary import apply_rotary

    cos, sin = rope_tables(40, 16, "cpu")
    x = torch.randn(2, 5, 3, 24)
    pos = torch.randint(0, 40, (2, 5))
    for interleaved in (True, False):
        expected = plain_rotary(x, cos, sin, pos, interleaved)
        assert max_error(apply_rotary(x, cos, sin, pos, interleaved), expected) < 1e-5


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(cache_seqlens=torch.tensor([79, 1], dtype=torch.int32), k=True), ValueError,
     r"^cache_seqlens: expected 0 <= cache_seqlens and cache_seqlens \+ 2 new tokens <= 80"),
    (dict(cache_seqlens=torch.tensor([1, 1])), TypeError, r"^cache_seqlens: expected dtype torch.int32"),
    (dict(block_table=torch.tensor([[0, 1], [2, 99]], dtype=torch.int32), paged=True), ValueError,
     r"^block_table: expected page indices in \[0, 10\)"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32), paged=True), ValueError, r"^block_table: expected shape"),
    (dict(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
     r"^cache_batch_idx: expected rows in \[0, 2\)"),
    (dict(num_splits=-1), ValueError, r"^num_splits: expected an int in \[0, 128\]"),
    (dict(k_only=True), ValueError, r"^k, v: give both"),
])
def test_bad_kvcache_arguments(kwargs, error, match):
    q = torch.randn(2, 1, 2, 16)
    if kwargs.pop("paged", False):
        k_cache = torch.randn(10, 16, 2, 16)
    else:
        k_cache = torch.randn(2, 80, 2, 16)
    v_cache = torch.randn_like(k_cache)
    if kwargs.pop("k", False):
        kwargs.update(k=torch.randn(2, 2, 2, 16), v=torch.randn(2, 2, 2, 16))
    if kwargs.pop("k_only", False):
        kwargs.update(k=torch.randn(2, 1, 2, 16), cache_seqlens=3)
    kwargs.setdefault("cache_seqlens", 3)
    with pytest.raises(error, match=match):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_gpu_kvcache(dtype, headdim, paged, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    run_case(batch=4, heads_q=32, heads_kv=8, headdim=headdim, capacity=4096, paged=paged, page_size=256,
             dtype=dtype, causal=True, rotary=(headdim, False))
    run_case(batch=2, seqlen_q=7, seqlen_new=7, heads_q=8, heads_kv=8, headdim=headdim, capacity=1024, paged=paged,
             page_size=64, dtype=dtype, causal=True, num_splits=5)


@pytest.mark.parametrize("splits, headdim", [(2, 16), (7, 40), (33, 128)])
def test_combine_kernel_follows_the_merge_rules(splits, headdim):
    # The split-KV combine kernel against merge_attention_states (the eager merge, its
    # rules tested in test_merge.py): empty splits (LSE -inf) weigh exactly 0 whatever
    # their buffer holds, an all-empty row gives 0 and -inf, a NaN LSE gives NaN.
    pytest.importorskip("triton")
    from flashtile.kernels.decode_launch import combine_splits

    batch, seqlen_q, heads = 2, 3, 4
    outs = torch.randn(splits, batch, seqlen_q, heads, headdim, device=DEVICE)
    lses = torch.randn(splits, batch, heads, seqlen_q, device=DEVICE) * 3
    lses[0, 0, 0, 0] = float("-inf")
    outs[0, 0, 0, 0] = float("nan")  # an empty split's unwritten row: never read
    lses[:, 0, 1, 1] = float("-inf")  # every split empty on this row
    lses[-1, 1, 2, 2] = float("nan")
    out, lse = combine_splits(outs, lses, torch.float32)
    want_out, want_lse = flashtile.merge_attention_states(outs, lses)
    assert torch.equal(out[0, 1, 1], torch.zeros(headdim, device=DEVICE))
    assert lse[0, 1, 1] == float("-inf")
    assert out[1, 2, 2].isnan().all() and lse[1, 2, 2].isnan()
    assert torch.equal(lse.isnan(), want_lse.isnan()) and torch.equal(out.isnan(), want_out.isnan())
    finite = ~want_out.isnan()
    assert max_error(out[finite], want_out[finite]) < 1e-5
    assert max_error(lse[~want_lse.isnan()], want_lse[~want_lse.isnan()]) < 1e-5


def test_split_rule_on_an_h200(monkeypatch):
    # The split rule on an H200's 132 SMs (stubbed: runs anywhere), 8 KV heads, 8k keys. Batch
    # 32 is 256 programs, under 2 per SM: one split (two read 17% slower on the H200). Batch 64
    # (512 programs) splits in two, to 1024, where batch 128 already is with one. Batch 4 gets
    # 8 splits; batch 1 is held at one split per 256 keys.
    pytest.importorskip("triton")
    from flashtile.kernels import decode_launch

    monkeypatch.setattr(decode_launch, "interpreting", lambda: False)
    monkeypatch.setattr(decode_launch, "sm_count", lambda device: 132)
    cuda = torch.device("cuda", 0)
    splits = {batch: decode_launch.choose_num_splits(batch, 8, 1, 8192, cuda) for batch in (1, 4, 32, 64, 128)}
    assert splits == {1: 32, 4: 8, 32: 1, 64: 2, 128: 1}



@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_gpu_decode_step_replays_from_a_cuda_graph(paged, monkeypatch):
    # docs/api.md's recipe for host-bound small-batch decoding: one step (append the new
    # token's k/v at cache_seqlens, attend) captured once and replayed with new inputs
    # written in place and the lengths advanced on the device. Each replay must give what
    # the eager step gives on a twin of the cache, bit for bit (same kernels, same splits),
    # and leave the same cache behind.
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    batch, heads_q, heads_kv, headdim, capacity, page = 2, 32, 8, 128, 1024, 256
    dev, dtype = "cuda", torch.bfloat16
    if paged:
        pages = batch * capacity // page
        k_cache, v_cache = (torch.randn(pages, page, heads_kv, headdim, device=dev, dtype=dtype) for _ in range(2))
        block_table = torch.randperm(pages, device=dev, dtype=torch.int32).view(batch, capacity // page)
    else:
        k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, headdim, device=dev, dtype=dtype)
                            for _ in range(2))
        block_table = None
    step_q = torch.randn(batch, 1, heads_q, headdim, device=dev, dtype=dtype)
    step_k, step_v = (torch.randn(batch, 1, heads_kv, headdim, device=dev, dtype=dtype) for _ in range(2))
    lens = torch.tensor([300, 517], device=dev, dtype=torch.int32)

    def step(q, k_cache, v_cache, k, v, lens):
        return flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                                 block_table=block_table, causal=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(step_q, k_cache, v_cache, step_k, step_v, lens)  # warm-up: compiles, appends at lens
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(step_q, k_cache, v_cache, step_k, step_v, lens)
    k_twin, v_twin, lens_twin = k_cache.clone(), v_cache.clone(), lens.clone()
    for _ in range(3):
        for buffer in (step_q, step_k, step_v):
            buffer.copy_(torch.randn_like(buffer))
        graph.replay()
        want = step(step_q, k_twin, v_twin, step_k, step_v, lens_twin)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(k_cache, k_twin) and torch.equal(v_cache, v_twin)
        lens += 1
        lens_twin += 1
