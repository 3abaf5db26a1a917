"""The Gluon Hopper kernels: the forward (kernels/gluon_fwd.py, FLASHTILE_GLUON) and the
backward (kernels/gluon_bwd.py, with gluon_bwd_wide.py's dK/dV kernel at d256;
FLASHTILE_GLUON_BWD), taken by default on sm_90 where they
were measured faster; the grids here force them on (=1) to reach every shape they cover.

Gluon has no interpreter, so the oracle tests need an sm_90 GPU; on the CPU the kernels are
compiled for sm_90 by tests/test_compile_check.py, and the choice of path is tested here.
Each grid switches one of them on, so a failure names its kernel: the forward's grid runs
the Triton backward on the Gluon forward's LSE, the backward's grid the Triton forward.
"""

from __future__ import annotations

import itertools
import math
import os
from types import SimpleNamespace

import pytest
import torch
import triton

import flashtile
from flashtile.kernels import fast_launch, hopper
from flashtile.masks import Band
from flashtile.testing import assert_close_to_oracle
from test_kernels import check_case

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _count_calls(monkeypatch, name: str) -> list:
    """The q shapes that hopper.<name> runs on from now on."""
    calls = []
    run = getattr(hopper, name)

    def counted(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return run(q, *args, **kwargs)

    monkeypatch.setattr(hopper, name, counted)
    return calls


@pytest.fixture
def gluon_calls(monkeypatch):
    """FLASHTILE_GLUON=1, and the list of q shapes the Gluon forward ran on."""
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    return _count_calls(monkeypatch, "forward")


@pytest.fixture
def gluon_backward_calls(monkeypatch):
    """FLASHTILE_GLUON_BWD=1 (the forward on Triton) with the seven-product kernels, and the q
    shapes the Gluon backward ran on."""
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "0")
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    return _count_calls(monkeypatch, "backward")


HAS_TMA_REDUCE = hopper._gluon() is not None and hopper._gluon_common().HAS_TMA_REDUCE


@pytest.fixture
def fused_backward_calls(monkeypatch):
    """FLASHTILE_GLUON_BWD=1 and FLASHTILE_GLUON_BWD_FUSED=1 (the forward on Triton), and the q
    shapes the five-product backward (gluon_bwd_fused.py) ran on."""
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "1")
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    return _count_calls(monkeypatch, "_fused_backward")


def test_the_gluon_switches_read_auto_1_or_0_and_the_usual_words_and_reject_anything_else(monkeypatch):
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    assert hopper.setting() == "auto" and hopper.setting(backward=True) == "auto"
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "0")
    assert hopper.setting() == "1" and hopper.setting(backward=True) == "0"
    monkeypatch.setenv("FLASHTILE_GLUON", "On")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "false")
    assert hopper.setting() == "1" and hopper.setting(backward=True) == "0"
    monkeypatch.setenv("FLASHTILE_GLUON", "gluon")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON: expected one of auto, 1, 0, got 'gluon'"):
        hopper.setting()


def test_auto_takes_gluon_only_where_it_was_measured_faster(monkeypatch):
    monkeypatch.delenv(hopper.FORWARD_PERSISTENT_SWITCH, raising=False)
    assert hopper.measured_faster(128, 1024, backward=False) and hopper.measured_faster(256, 512, backward=False)
    # d64 forward: from 4k keys, and from 1k where it runs on persistent programs (timed there:
    # every causal call, non-causal to 4k keys); the Triton forward below 1k
    assert not hopper.measured_faster(64, 512, backward=False) and hopper.measured_faster(64, 1024, backward=False)
    assert not hopper.measured_faster(64, 512, backward=False, causal=True)
    assert hopper.measured_faster(64, 1024, backward=False, causal=True)
    assert hopper.measured_faster(64, 2048, backward=False) and hopper.measured_faster(64, 2048, False, causal=True)
    assert hopper.measured_faster(64, 4096, backward=False, causal=True)
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "0")
    assert not hopper.measured_faster(64, 1024, backward=False) and hopper.measured_faster(64, 4096, backward=False)
    monkeypatch.delenv(hopper.FORWARD_PERSISTENT_SWITCH)
    # the block-sparse d64 forward (no persistent programs) from 4k keys, as before them
    assert not hopper.measured_faster(64, 2048, backward=False, block_sparse=True)
    assert hopper.measured_faster(64, 4096, backward=False, block_sparse=True)
    assert hopper.measured_faster(128, 1024, backward=True) and hopper.measured_faster(64, 1024, backward=True)
    assert hopper.measured_faster(256, 16384, backward=True)


def test_the_gluon_kernels_are_never_taken_off_hopper(monkeypatch):
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    plain = dict(softcap=0.0, alibi_slopes=None, bias=None, dropout_p=0.0, varlen=None, block_mask=None,
                 score_mod=None)
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    # CPU tensors keep the Triton kernels whatever the switches say; without the interpreter
    # (which the CPU suite runs under, and which also says no) the tensors' device decides.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not hopper.eligible(q, q, q, q, Band(None, 0), **plain)
    assert not hopper.eligible(q, q, q, q, Band(None, 0), **plain, backward=True, grads=(q, q, q, q))


def test_eligible_answers_each_condition_on_its_own(monkeypatch):
    # hopper.eligible as on an H200 (its device check passed): yes for a plain call the kernels
    # cover, no for each single thing they do not. The GPU tests run the kernels it picks; this
    # pins each answer down on the CPU, for whoever makes the question cheaper.
    monkeypatch.setattr(hopper, "_device_runs_them", lambda q: True)
    monkeypatch.setattr(hopper, "_FAILED", set())
    monkeypatch.setenv("FLASHTILE_GLUON", "auto")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "auto")
    monkeypatch.delenv(hopper.FORWARD_CONSUMERS_SWITCH, raising=False)
    plain = dict(softcap=0.0, alibi_slopes=None, bias=None, dropout_p=0.0, varlen=None, block_mask=None,
                 score_mod=None)

    def tensors(head_dim=128, seqlen=1024, dtype=torch.bfloat16):
        q, k, v, out = (torch.empty(2, 4, seqlen, head_dim, dtype=dtype) for _ in range(4))
        return q, k, v, out

    def eligible(q, k, v, out, band=Band(None, 0), backward=False, grads=(), **options):
        return hopper.eligible(q, k, v, out, band, **{**plain, **options}, backward=backward, grads=grads)

    q, k, v, out = tensors()
    assert eligible(q, k, v, out) and eligible(q, k, v, out, Band(None, None))
    assert eligible(q, k, v, out, backward=True, grads=(out, q, k, v))
    # options the kernels do not run
    for option in (dict(softcap=5.0), dict(alibi_slopes=torch.ones(4)), dict(bias=torch.zeros(1)),
                   dict(dropout_p=0.1), dict(varlen=object()), dict(score_mod=object())):
        assert not eligible(q, k, v, out, **option), option
    assert not eligible(q, k, v, out, Band(8, 0)) and not eligible(q, k, v, out, Band(None, 3))
    # element types: one per kernel, bf16 or fp16
    assert eligible(*tensors(dtype=torch.float16))
    assert not eligible(*tensors(dtype=torch.float32))
    assert not eligible(q, k.half(), v, out)
    assert not eligible(q, k, v, out, backward=True, grads=(out.half(), q, k, v))
    # head dims up to 256; under auto where measured faster (d64's forward from 1k keys only)
    assert not eligible(*tensors(head_dim=264))
    assert not eligible(*tensors(head_dim=64, seqlen=512)) and eligible(*tensors(head_dim=64))
    assert eligible(*tensors(head_dim=64), backward=True)
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert eligible(*tensors(head_dim=64)) and eligible(*tensors(head_dim=80))
    monkeypatch.setenv("FLASHTILE_GLUON", "0")
    assert not eligible(q, k, v, out) and eligible(q, k, v, out, backward=True)
    monkeypatch.setenv("FLASHTILE_GLUON", "auto")
    # what TMA cannot address: a start off 16 bytes, a stride that is not, a strided last dim
    shifted = torch.empty(2 * 4 * 1024 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 4, 1024, 128)
    assert shifted.data_ptr() % 16 != 0 and not eligible(shifted, k, v, out)
    odd_rows = torch.empty(2, 4, 1024, 132, dtype=torch.bfloat16)[..., :128]  # rows of 264 bytes
    assert eligible(odd_rows.contiguous(), k, v, out) and not eligible(odd_rows, k, v, out)
    assert not eligible(q, k, v, torch.empty(2, 4, 128, 1024, dtype=torch.bfloat16).transpose(2, 3))
    assert not eligible(q, k, v, out, backward=True, grads=(out, q, k, shifted))
    # empty tensors, and a kernel that failed to build here
    assert not eligible(*tensors(seqlen=0))
    hopper._FAILED.add(hopper._failure_key(False, q, causal=True))
    assert not eligible(q, k, v, out) and eligible(q, k, v, out, Band(None, None))


def test_a_gluon_kernel_that_fails_to_build_falls_back_to_triton_once_with_a_warning(monkeypatch):
    # A Triton whose Gluon moved (or a ptxas error) must not break attention under auto: the
    # call runs the Triton kernels, one warning names the error, the kernel is not retried.
    from triton.runtime.errors import PTXASError

    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setattr(hopper, "_FAILED", set())
    attempts = []

    def broken(name, error):
        def launch(q, *args, **kwargs):
            attempts.append(name)
            raise error
        return launch

    # Here (no sm_90) eligible says no; pretend it says yes until the kernel is marked broken.
    def eligible(q, k, v, out, band, *, backward=False, **options):
        return hopper._failure_key(backward, q, causal=band.right == 0) not in hopper._FAILED

    monkeypatch.setattr(hopper, "eligible", eligible)
    monkeypatch.setattr(hopper, "forward", broken("forward", PTXASError("ptxas fatal: unknown option")))
    monkeypatch.setattr(hopper, "backward", broken("backward", TypeError("warp_specialize() got an unexpected "
                                                                         "keyword argument")))
    with pytest.warns(RuntimeWarning) as caught:
        check_case(1, 37, 53, 4, 2, 64, torch.float16, causal=True)  # against the oracle
        check_case(1, 37, 53, 4, 2, 64, torch.float16, causal=True)
    messages = [str(w.message) for w in caught if "Gluon" in str(w.message)]
    assert len(messages) == 2, messages  # once for the forward, once for the backward
    assert "PTXASError" in messages[0] and "ptxas fatal: unknown option" in messages[0]
    assert "head dim 64, float16, causal=True" in messages[0] and "FLASHTILE_GLUON=0" in messages[0]
    assert "TypeError" in messages[1] and "FLASHTILE_GLUON_BWD=1 makes this an error" in messages[1]
    assert attempts == ["forward", "backward"]  # the second call did not try again


def test_a_gluon_error_is_raised_when_forced_or_not_a_build_error(monkeypatch):
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(hopper, "_FAILED", set())
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    assert not hopper.falls_back(TypeError("moved"), q, backward=False, causal=True)  # forced: the error stands
    monkeypatch.setenv("FLASHTILE_GLUON", "auto")
    assert not hopper.falls_back(ValueError("a wrong argument of ours"), q, backward=False, causal=True)
    assert not hopper.falls_back(RuntimeError("CUDA error: an illegal memory access"), q, backward=False, causal=True)
    assert hopper._FAILED == set()
    with pytest.warns(RuntimeWarning, match="PassManager::run failed"):  # MLIR's pipeline failing: a build error
        assert hopper.falls_back(RuntimeError("PassManager::run failed"), q, backward=False, causal=True)
    # (the d64 forward's kernel under auto: three consumer warpgroups)
    assert hopper._FAILED == {("three-consumer forward", 64, torch.bfloat16, True, None)}


@pytest.mark.parametrize("zeroes", [False, True], ids=["stats", "stats+dq-sum"])
@pytest.mark.parametrize("with_dlse", [False, True], ids=["out", "out+lse"])
def test_the_five_product_backward_stats_come_padded_from_one_preprocess(with_dlse, zeroes):
    # The Gluon backward reads LSE·log2(e) and D from (B·Hq, S_pad) rows; for the five-product
    # kernel the preprocess writes them there, padding rows included (+inf and 0), on the CPU
    # through the interpreter, and zeroes that kernel's float32 dQ sum (the same padded rows, the
    # kernel's width) and its scheduler's counter where given. (The seven-product dQ kernels write
    # the stats themselves: the GPU grids below check those through the gradients, rows past the
    # end and rows without keys included.)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, seqlen, head_dim = 2, 3, 130, 40  # S_pad = 256: two padding blocks per row
    out, dout = (torch.randn(batch, seqlen, heads, head_dim, device=device).transpose(1, 2) for _ in range(2))
    lse = torch.randn(batch, heads, seqlen, device=device)
    lse[0, 1, 5:9] = float("-inf")  # rows that saw no key
    dlse = torch.randn(batch, heads, seqlen, device=device) if with_dlse else None
    lse2, delta = (torch.full((batch * heads, 256), float("nan"), device=device) for _ in range(2))
    # (a row past the sum's end, which must stay as it was)
    dq_sum = torch.full((batch * heads * 256 + 1, hopper.kernel_head_dim(head_dim)), float("nan"), device=device)
    counter = torch.full((1,), 7, dtype=torch.int32, device=device)
    if zeroes:
        hopper._RowStats(out, dout, lse, dlse, lse2, delta).preprocess(dq_sum[:-1], counter)
        assert not dq_sum[:-1].any() and int(counter) == 0 and dq_sum[-1].isnan().all()
    else:
        hopper._RowStats(out, dout, lse, dlse, lse2, delta).preprocess()
        assert dq_sum.isnan().all() and int(counter) == 7

    assert lse2.shape == delta.shape == (batch * heads, 256)
    expected_lse2 = torch.full((batch * heads, 256), float("inf"), device=device)
    expected_lse2[:, :seqlen] = torch.where(lse == float("-inf"), float("inf"), lse * hopper.LOG2E).reshape(-1, seqlen)
    expected_delta = torch.zeros((batch * heads, 256), device=device)
    rowsum = (out.double() * dout.double()).sum(-1) - (dlse.double() if with_dlse else 0)
    expected_delta[:, :seqlen] = rowsum.reshape(-1, seqlen).float()
    torch.testing.assert_close(lse2, expected_lse2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(delta, expected_delta, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_a_descriptor_from_the_cache_equals_a_newly_checked_one_and_the_cache_keeps_no_tensor():
    # The launches reuse checked descriptors of the same shape, strides, dtype and tile, with
    # the new call's tensor put in: each field must equal what Triton's constructor builds.
    TensorDescriptor = hopper._gluon()[2]
    first, second = (torch.randn(2, 9, 3, 64, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    hopper._tile_descriptor(first, 64)
    cached = hopper._tile_descriptor(second, 64)
    built = TensorDescriptor(second, list(second.shape), list(second.stride()), [1, 1, 64, 64],
                             hopper._tile_layout(64, 64, torch.bfloat16))
    assert type(cached) is type(built) and cached.base is second
    # (besides the fields, the cached one carries the key fast_launch reads: one per template)
    assert {name: value for name, value in vars(cached).items() if name not in ("base", fast_launch.LAUNCH_KEY)} \
        == {name: value for name, value in vars(built).items() if name != "base"}
    assert all(template.base is None for template in hopper._DESCRIPTOR_TEMPLATES.values())
    # Another tile, width, stride or dtype is another key: never a descriptor of the wrong box.
    other = hopper._tile_descriptor(second, 128)
    assert other.block_shape == [1, 1, 128, 64]
    assert hopper._tile_descriptor(second, 64, 128).block_shape == [1, 1, 64, 128]
    assert hopper._tile_descriptor(second, 64).block_shape == [1, 1, 64, 64]
    contiguous = second.contiguous()
    assert hopper._tile_descriptor(contiguous, 64).strides == list(contiguous.stride())
    halves = second.half()
    assert hopper._tile_descriptor(halves, 64).layout == hopper._tile_layout(64, 64, torch.float16)
    # Its lists are the template's (Triton's launcher only reads them): still the first call's.
    assert cached.shape == list(second.shape) and cached.strides == list(second.stride())
    assert cached.block_shape == [1, 1, 64, 64]


class _RecordLaunch:
    """kernel[grid](*args, **constexprs) that records what it was given instead of launching;
    ``warmup`` (a binary built for a check before the launch) records "warmup" and returns a
    binary whose PTX is ``ptx``."""

    def __init__(self, launches: list, name: str, ptx: str = ""):
        self.launches, self.name, self.ptx = launches, name, ptx

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.name, grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.launches.append(("warmup", grid, args, kwargs))
        return SimpleNamespace(asm={"ptx": self.ptx})


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("dq_stats", ["1", "0"], ids=["dq-kernel-stats", "preprocess"])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 40, 96, 192])
def test_the_gluon_backward_hands_each_kernel_descriptors_of_its_own_tiles(monkeypatch, head_dim, dq_stats):
    # The host side of the Gluon backward, kernels stubbed: each kernel's descriptors must move
    # the tiles its constexprs say (a mismatch is a wrong answer or a hang on the GPU). d256
    # takes gluon_bwd_wide's dK/dV kernel, whose K/V tiles are whole BLOCK_N rows; head dims
    # between run the next kernel's width (40 -> 64, 96 -> 128, 192 -> 256) over zero columns.
    _, _, _, gluon_bwd, gluon_bwd_wide = hopper._gluon()
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "0")  # the seven-product kernels (the fused one: below)
    monkeypatch.setenv("FLASHTILE_GLUON_DQ_STATS", dq_stats)
    launches = []
    for module, name in ((gluon_bwd, "_dkdv_kernel"), (gluon_bwd_wide, "_dkdv_wide_kernel"),
                         (gluon_bwd, "_dq_kernel")):
        monkeypatch.setattr(module, name, _RecordLaunch(launches, name))
    monkeypatch.setattr(hopper._RowStats, "preprocess", lambda stats: launches.append(("preprocess", stats)))
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = 2, 6, 2, 300, 333
    q, dout, dq, out = (torch.randn(batch, heads_q, seqlen_q, head_dim, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.randn(batch, heads_kv, seqlen_k, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse, dlse = (torch.randn(batch, heads_q, seqlen_q) for _ in range(2))
    hopper.backward(q, k, v, out, dout, lse, dlse, head_dim ** -0.5, True, dq, dk, dv)

    width = hopper.kernel_head_dim(head_dim)
    # The rows' LSE·log2(e) and D, which the dK/dV kernel reads, come first: from the dQ kernel
    # (FLASHTILE_GLUON_DQ_STATS=1) or from the preprocess, launched before it.
    if dq_stats == "0":
        name, stats = launches.pop(0)
        assert name == "preprocess" and stats.out is out and stats.dlse is dlse
    assert [name for name, *_ in launches] == [
        "_dq_kernel", "_dkdv_wide_kernel" if width == 256 else "_dkdv_kernel"]
    (_, grid_q, args_q, const_q), (_, grid_kv, args_kv, const_kv) = launches
    assert const_kv["HEAD_DIM"] == const_q["HEAD_DIM"] == width
    m, n = const_kv["BLOCK_M"], const_kv["BLOCK_N"]
    kv_rows = n if width == 256 else n // 2  # whole tiles, or one half per warpgroup
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc = args_kv[:8]
    assert [d.base for d in (q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc)] == [q, dout, k, v, dk, dv]
    assert q_desc.block_shape == do_desc.block_shape == [1, 1, m, width]
    for d in (k_desc, v_desc, dk_desc, dv_desc):
        assert d.block_shape == [1, 1, kv_rows, width] and d.shape[3] == head_dim
    assert lse_desc.block_shape == delta_desc.block_shape == [1, m]
    assert grid_kv == (triton.cdiv(seqlen_k, n) * batch * heads_kv,)
    dq_m, dq_n = const_q["BLOCK_M"], const_q["BLOCK_N"]
    q_half, do_half, k_tile, v_tile, dq_half = args_q[:5]
    assert [d.base for d in (q_half, do_half, k_tile, v_tile, dq_half)] == [q, dout, k, v, dq]
    for d in (q_half, do_half, dq_half):
        assert d.block_shape == [1, 1, dq_m // 2, width]
    assert k_tile.block_shape == v_tile.block_shape == [1, 1, dq_n, width]
    assert grid_q == (triton.cdiv(seqlen_q, dq_m) * batch * heads_q,)
    # the stats rows: the dQ kernel's grid covers every padded row, which the dK/dV tiles read
    lse2, delta, stride_lrow = args_q[5:8]
    s_pad = 384
    assert lse2.shape == delta.shape == (batch * heads_q, s_pad) and stride_lrow == s_pad
    assert lse_desc.base is lse2 and delta_desc.base is delta
    assert triton.cdiv(seqlen_q, dq_m) * dq_m == s_pad and s_pad % m == 0
    assert const_q["ROW_STATS"] == const_q["HAS_DLSE"] == (dq_stats == "1")  # (without ROW_STATS dLSE is unread)
    if dq_stats == "1":
        assert args_q[8:12] == (out, dout, lse, dlse)
        assert args_q[12:20] == (*out.stride()[:3], *dout.stride()[:3], *lse.stride()[:2])
        assert args_q[20] == head_dim  # the columns the stats read: the tensor's, not the kernel's width
    else:  # constexpr Nones: the kernel main had, with its parameters and binary
        assert args_q[8:21] == (None,) * 13
    assert args_q[21] == heads_q


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("seqlen_k", [333, hopper.DQ_STATS_MAX_KEYS, hopper.DQ_STATS_MAX_KEYS + 1])
def test_under_auto_the_dq_kernel_writes_the_row_stats_up_to_the_measured_length(monkeypatch, seqlen_k):
    # auto: the dQ kernel's own stats where session 18 timed them no slower (dq_stats_measured_faster),
    # the preprocess launch beyond; block-sparse calls: test_gluon_listed.py
    gluon_bwd = hopper._gluon()[3]
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "0")
    monkeypatch.delenv("FLASHTILE_GLUON_DQ_STATS", raising=False)
    launches = []
    for name in ("_dkdv_kernel", "_dq_kernel"):
        monkeypatch.setattr(gluon_bwd, name, _RecordLaunch(launches, name))
    monkeypatch.setattr(hopper._RowStats, "preprocess", lambda stats: launches.append(("preprocess", stats)))
    q, dout, dq, out = (torch.randn(1, 2, 40, 64, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.randn(1, 2, seqlen_k, 64, dtype=torch.bfloat16) for _ in range(4))
    hopper.backward(q, k, v, out, dout, torch.randn(1, 2, 40), None, 0.125, False, dq, dk, dv)
    in_dq_kernel = seqlen_k <= hopper.DQ_STATS_MAX_KEYS
    assert [launch[0] for launch in launches] == ["_dq_kernel", "_dkdv_kernel"] if in_dq_kernel \
        else ["preprocess", "_dq_kernel", "_dkdv_kernel"]
    assert launches[-2][3]["ROW_STATS"] == in_dq_kernel


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("reduction", ["gluon", "ptx"])
@pytest.mark.parametrize("head_dim", [64, 128, 40, 96])
def test_the_fused_backward_hands_its_kernels_descriptors_of_their_own_tiles(monkeypatch, head_dim, reduction):
    # The host side of gluon_bwd_fused.py's backward, kernels stubbed: Q-side and key tiles as
    # its constexprs say, the float32 dQ sum zeroed, (B·Hq·S_pad, width) with boxes of half the
    # width, and the conversion reading it back into dq. "ptx": a Triton whose Gluon lacks TMA
    # reductions (3.6, 3.7): the kernel is told to store, the rewrite is installed, and the
    # binary is checked before the launch.
    from flashtile.kernels import tma_reduce_ptx

    if reduction == "gluon" and not HAS_TMA_REDUCE:
        pytest.skip("this Triton's Gluon has no TMA reductions (3.8+)")
    monkeypatch.setattr(hopper._gluon_common(), "HAS_TMA_REDUCE", reduction == "gluon")
    monkeypatch.setattr(triton.knobs.runtime, "add_stages_inspection_hook", None)  # (restored afterwards)
    monkeypatch.setattr(tma_reduce_ptx, "_installed", None)
    gluon_bwd_fused = hopper._fused_module()
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "1")
    launches = []
    for name in ("_dkdv_dq_kernel", "_dq_convert"):
        monkeypatch.setattr(gluon_bwd_fused, name,
                            _RecordLaunch(launches, name, tma_reduce_ptx.REDUCE * tma_reduce_ptx.REDUCTIONS))
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = 2, 6, 2, 300, 333
    q, dout, dq, out = (torch.randn(batch, heads_q, seqlen_q, head_dim, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.randn(batch, heads_kv, seqlen_k, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse = torch.randn(batch, heads_q, seqlen_q)
    s_pad = 384
    monkeypatch.setattr(hopper._RowStats, "preprocess", _zeroing_preprocess(launches))
    streams = []  # what the causal grid's grouping was told each program streams (attempt 52)
    grouping = hopper.causal_heads_per_group
    monkeypatch.setattr(hopper, "causal_heads_per_group",
                        lambda *args, **kwargs: (streams.append(kwargs["streams_for"]), grouping(*args, **kwargs))[1])
    monkeypatch.setattr(hopper, "sm_count", lambda device: 132)  # (an H200's, for persistent programs)
    hopper.backward(q, k, v, out, dout, lse, None, head_dim ** -0.5, True, dq, dk, dv)
    # the group's Q and dO, and the dQ sum's float32 rows of those heads: as many bytes again
    assert streams == [2 * (heads_q // heads_kv)]

    width = hopper.kernel_head_dim(head_dim)
    # the preprocess writes the stats rows first (this kernel has no dQ kernel to do it) and zeroes
    # the dQ sum and the counter the kernel then takes
    (_, stats, zeroed_sum, zeroed_counter), *launches = launches
    lse2, delta = stats.lse2, stats.delta
    assert lse2.shape == delta.shape == (batch * heads_q, s_pad) and stats.out is out and stats.lse is lse
    if reduction == "ptx":  # the binary built and checked first, with the kernel's own arguments
        (_, warm_grid, warm_args, warm_const), *launches = launches
        assert warm_grid == launches[0][1] and warm_args == launches[0][2] and warm_const == launches[0][3]
        assert triton.knobs.runtime.add_stages_inspection_hook is tma_reduce_ptx._installed is not None
    else:
        assert triton.knobs.runtime.add_stages_inspection_hook is None  # nothing installed
    assert [name for name, *_ in launches] == ["_dkdv_dq_kernel", "_dq_convert"]
    (_, grid, args, const), (_, grid_convert, args_convert, const_convert) = launches
    assert const["HEAD_DIM"] == const_convert["HEAD_DIM"] == width and const["CAUSAL"]
    assert const["REDUCE_BY_PTX"] == (reduction == "ptx")
    # a causal call: Q tiles last first at the head dims the table names (attempt 51)
    assert const["Q_DESCENDING"] == hopper.FUSED_Q_DESCENDING.get(width, False)
    m, n = const["BLOCK_M"], const["BLOCK_N"]
    q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc, sum_desc = args[:9]
    assert [d.base for d in (q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc)] == [q, dout, k, v, dk, dv]
    assert q_desc.block_shape == do_desc.block_shape == [1, 1, m, width]
    for d in (k_desc, v_desc, dk_desc, dv_desc):
        assert d.block_shape == [1, 1, n // 2, width]
    assert lse_desc.base is lse2 and delta_desc.base is delta and lse_desc.block_shape == [1, m]
    dq_sum = sum_desc.base
    rows = batch * heads_q * s_pad
    assert dq_sum.shape == (rows, width) and dq_sum.dtype == torch.float32
    assert not dq_sum.any() and sum_desc.block_shape == [m, width // 2]
    num_n_blocks = triton.cdiv(seqlen_k, n)
    assert grid == (num_n_blocks * batch * heads_kv,)  # (12 key tiles: persistent or not, a program each)
    # persistent programs where auto says (attempt 76: causal d64 at a key tile's 900 rows, its kv
    # head's 3 query heads × 300; causal d128 at any length), on the dynamic scheduler (causal calls
    # under auto since session 33)
    rows_a_tile = (heads_q // heads_kv) * seqlen_q
    assert const["PERSISTENT"] and hopper.fused_persistent(width, True, rows_a_tile) and hopper.fused_dynamic(True)
    scale = head_dim ** -0.5
    # causal, and the kv heads' Q and dO far inside L2: one group of every (batch, kv head) row
    assert args[9:23] == (heads_q, heads_kv, heads_q // heads_kv, seqlen_q, seqlen_k, num_n_blocks, batch * heads_kv,
                          s_pad, pytest.approx(scale * hopper.LOG2E), scale, 0, 1, None, None)
    # (no tail split; the dynamic scheduler's tile counter, zeroed)
    counter = args[23]
    assert counter.dtype == torch.int32 and counter.shape == (1,) and int(counter) == 0
    assert zeroed_sum is dq_sum and zeroed_counter is counter
    assert not const["TAIL_SPLIT"]
    assert args_convert[0] is dq_sum and args_convert[1] is dq
    assert args_convert[2:] == (*dq.stride()[:3], heads_q, seqlen_q, head_dim, s_pad, scale)
    # batch × heads on the grid's first axis: the second stops at 65535
    assert grid_convert == (batch * heads_q, triton.cdiv(seqlen_q, const_convert["BLOCK"]))


def test_the_tail_split_runs_the_last_programs_in_parts_where_that_ends_the_grid_sooner():
    # 2048 equal programs (every d128 cell of the speed grid) on 132 SMs: 16 waves, the last
    # 68 programs alone in the last one; in 7 parts each they end at 15.57 waves
    assert hopper.tail_split(2048, 132, 256) == (1980, 7)
    assert hopper.tail_split(4096, 132, 128) == (4092, 4)  # d64: 4 programs in a 32nd wave
    assert hopper.tail_split(2048, 132, 40) is None  # parts of fewer than TAIL_MIN_STEPS steps
    assert hopper.tail_split(264, 132, 256) is None and hopper.tail_split(100, 132, 256) is None
    for programs in range(133, 3000, 7):  # what it returns ends sooner by the margin, by the model
        for sms in (132, 114, 78):
            split = hopper.tail_split(programs, sms, 256)
            if split is None:
                continue
            whole, splits = split
            waves = whole / sms + -(-(programs - whole) * splits // sms) / splits
            assert 0 < programs - whole < programs and 2 <= splits <= hopper.TAIL_MAX_SPLITS
            assert waves <= -(-programs // sms) * (1 - hopper.TAIL_MIN_GAIN) and 256 // splits >= 32


def test_the_tail_split_is_off_under_auto_and_for_causal_grids(monkeypatch):
    monkeypatch.setattr(hopper, "sm_count", lambda device: 132)
    q = torch.empty(1, 16, 16384, 128)
    monkeypatch.delenv(hopper.TAIL_SWITCH, raising=False)
    assert not hopper.TAIL_UNDER_AUTO and hopper._takes_tail_split(q, False, 2048, 256) is None
    monkeypatch.setenv(hopper.TAIL_SWITCH, "1")
    assert hopper._takes_tail_split(q, False, 2048, 256) == (1980, 7)
    assert hopper._takes_tail_split(q, True, 2048, 256) is None  # heaviest first: no empty wave
    monkeypatch.setenv(hopper.TAIL_SWITCH, "0")
    assert hopper._takes_tail_split(q, False, 2048, 256) is None


def _recorded_forward_launches(monkeypatch) -> list:
    """The dense Gluon forward's kernel stubbed: the list its launches go to ((name, grid, args,
    constexprs), as _RecordLaunch records them)."""
    launches = []
    monkeypatch.setattr(hopper._gluon()[0], "_fwd_pingpong_kernel", _RecordLaunch(launches, "forward"))
    return launches


def _stubbed_fused_backward(monkeypatch) -> list:
    """The host side of the five-product backward with its kernels stubbed: FLASHTILE_GLUON_BWD_FUSED=1,
    Gluon's TMA reduction (no PTX rewrite to check), a preprocess that only zeroes the dQ sum and the
    counter (_zeroing_preprocess); returns the list its kernels'
    launches go to ((name, grid, args, constexprs), as _RecordLaunch records them)."""
    gluon_bwd_fused = hopper._fused_module()
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "1")
    monkeypatch.setattr(hopper._gluon_common(), "HAS_TMA_REDUCE", True)
    launches = []
    for name in ("_dkdv_dq_kernel", "_dq_convert", "_dkdv_parts_convert"):
        monkeypatch.setattr(gluon_bwd_fused, name, _RecordLaunch(launches, name))
    monkeypatch.setattr(hopper._RowStats, "preprocess", _zeroing_preprocess(None))
    return launches


def _zeroing_preprocess(launches: list | None):
    """A stand-in for _RowStats.preprocess that writes no stats but zeroes the dQ sum and counter
    it is given, as the launch does (the interpreter test of the preprocess checks that), and
    records ("preprocess", stats, dq_sum, counter) in ``launches`` where given."""
    def preprocess(stats, dq_sum=None, counter=None):
        for buffer in (dq_sum, counter):
            if buffer is not None:
                buffer.zero_()
        if launches is not None:
            launches.append(("preprocess", stats, dq_sum, counter))
    return preprocess


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_a_split_fused_backward_launches_the_parts_and_sums_them_back(monkeypatch):
    # The host side with the tail split on (kernels stubbed): 12 programs (2 batches × 2 kv
    # heads × 3 key tiles) on a pretend 5 SMs end at 3 waves; the last 2 in 2 parts each end at
    # 2.5. The kernel gets the parts' grid, n_whole, splits and the float32 partials; the
    # conversion sums each split tile's parts into dk and dv.
    launches = _stubbed_fused_backward(monkeypatch)
    monkeypatch.setenv(hopper.TAIL_SWITCH, "1")
    monkeypatch.setattr(hopper, "sm_count", lambda device: 5)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = 2, 6, 2, 2048, 333
    q, dout, dq, out = (torch.randn(batch, heads_q, seqlen_q, 128, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.randn(batch, heads_kv, seqlen_k, 128, dtype=torch.bfloat16) for _ in range(4))
    hopper.backward(q, k, v, out, dout, torch.randn(batch, heads_q, seqlen_q), None, 0.125, False, dq, dk, dv)
    assert [name for name, *_ in launches] == ["_dkdv_dq_kernel", "_dkdv_parts_convert", "_dq_convert"]
    (_, grid, args, const), (_, grid_sum, args_sum, const_sum), _ = launches
    assert hopper.tail_split(12, 5, 3 * 32) == (10, 2)  # steps: 3 query heads × 32 Q tiles of 64
    assert grid == (10 + 2 * 2,) and const["TAIL_SPLIT"] and args[19:21] == (10, 2)
    parts = args[21:23]
    assert all(t.shape == (2 * 2 * 128, 128) and t.dtype == torch.float32 for t in parts)
    assert grid_sum == (2, 128 // const_sum["ROWS"]) and args_sum[:4] == (*parts, dk, dv)
    assert args_sum[4:] == (*dk.stride()[:3], *dv.stride()[:3], 10, 2, 3, heads_kv, seqlen_k, 128)
    launches.clear()
    hopper.backward(q, k, v, out, dout, torch.randn(batch, heads_q, seqlen_q), None, 0.125, True, dq, dk, dv)
    (_, grid, args, const), _ = launches  # causal: no split; persistent programs on the counter
    assert grid == (5,) and const["PERSISTENT"] and not const["TAIL_SPLIT"] and args[19:23] == (0, 1, None, None)
    assert args[23] is not None


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.skipif(not hasattr(triton, "jit"), reason="Triton's interpreter")
def test_the_parts_conversion_sums_each_split_tiles_parts_into_its_keys():
    # _dkdv_parts_convert in Triton's interpreter: key tiles 5 and 6 of a grid of 2 × 2 heads ×
    # 2 tiles (n_whole 5, 3 parts each) are (bh 2, tile 1) and (bh 3, tile 0); head dim 96 on the
    # 128-wide kernel: the extra columns and the keys past 200 are not written.
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the conversion kernel on CPU tensors in Triton's interpreter")
    gluon_bwd_fused = hopper._fused_module()
    splits, block_n, width, seqlen_k, heads_kv = 3, 128, 128, 200, 2
    dk_part, dv_part = (torch.randn(2 * splits * block_n, width) for _ in range(2))
    dk, dv = (torch.zeros(2, heads_kv, seqlen_k, 96) for _ in range(2))
    dv_view = torch.zeros(2, seqlen_k, heads_kv, 96).transpose(1, 2)  # bshd strides for dv
    gluon_bwd_fused._dkdv_parts_convert[(2, block_n // 64)](
        dk_part, dv_part, dk, dv_view, *dk.stride()[:3], *dv_view.stride()[:3], 5, splits, 2, heads_kv, seqlen_k, 96,
        BLOCK_N=block_n, HEAD_DIM=width, ROWS=64)
    sums = [p.view(2, splits, block_n, width).sum(1) for p in (dk_part, dv_part)]
    expected_k, expected_v = torch.zeros_like(dk), torch.zeros_like(dk)
    expected_k[1, 0, 128:200], expected_v[1, 0, 128:200] = sums[0][0, :72, :96], sums[1][0, :72, :96]  # bh 2: tile 1
    expected_k[1, 1, 0:128], expected_v[1, 1, 0:128] = sums[0][1, :, :96], sums[1][1, :, :96]  # bh 3: tile 0
    torch.testing.assert_close(dk, expected_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dv_view, expected_v, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("failure", ["build", "store-left"])
def test_a_fused_backward_that_fails_to_build_falls_back_under_auto_and_is_an_error_under_1(monkeypatch, failure):
    # Kernels stubbed. "build": the fused one raises what a Gluon API that moved raises
    # (AttributeError). "store-left": before Triton 3.8, its binary still stores dQ where the PTX
    # rewrite should have made it add (tma_reduce_ptx.check), caught before any launch.
    # auto: one warning, the seven-product kernels run, and only the fused kernel is remembered
    # as broken. =1: an error of its own type, which hopper.falls_back (the whole Gluon
    # backward's fallback to Triton under FLASHTILE_GLUON_BWD=auto) does not swallow.
    from flashtile.kernels import tma_reduce_ptx

    gluon_bwd_fused, (_, _, _, gluon_bwd, _) = hopper._fused_module(), hopper._gluon()

    class _Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise AttributeError("module 'tma' has no attribute 'async_atomic_add'")
            return launch

    launches = []
    if failure == "build":
        if not HAS_TMA_REDUCE:
            pytest.skip("this Triton's Gluon has no TMA reductions (3.8+)")
        monkeypatch.setattr(gluon_bwd_fused, "_dkdv_dq_kernel", _Broken())
        message = "AttributeError"
    else:
        monkeypatch.setattr(hopper._gluon_common(), "HAS_TMA_REDUCE", False)
        monkeypatch.setattr(hopper, "PTX_REDUCE_UNDER_AUTO", True)
        monkeypatch.setattr(triton.knobs.runtime, "add_stages_inspection_hook", None)  # (restored afterwards)
        monkeypatch.setattr(tma_reduce_ptx, "_installed", None)
        monkeypatch.setattr(gluon_bwd_fused, "_dkdv_dq_kernel",
                            _RecordLaunch(launches, "_dkdv_dq_kernel", ptx=tma_reduce_ptx.STORE))
        message = "ReductionRewriteError"
    for name in ("_dkdv_kernel", "_dq_kernel"):
        monkeypatch.setattr(gluon_bwd, name, _RecordLaunch(launches, name))
    monkeypatch.setattr(hopper, "_FUSED_FAILED", set())
    monkeypatch.setattr(hopper, "FUSED_UNDER_AUTO", True)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    q, dout, dq, k, v, dk, dv, out = (torch.randn(1, 2, 300, 128, dtype=torch.bfloat16) for _ in range(8))
    lse = torch.randn(1, 2, 300)
    monkeypatch.setattr(hopper._RowStats, "preprocess", _zeroing_preprocess(None))
    monkeypatch.setattr(hopper, "sm_count", lambda device: 132)  # (persistent programs at 300 rows)

    def run():
        hopper.backward(q, k, v, out, dout, lse, None, 128 ** -0.5, False, dq, dk, dv)

    def launched():  # (the check's build is not a launch)
        return [name for name, *_ in launches if name != "warmup"]

    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "1")
    with pytest.raises(hopper.FusedBackwardError, match=f"FLASHTILE_GLUON_BWD_FUSED=1: .*{message}") as caught:
        run()
    assert not hopper.falls_back(caught.value, q, backward=True, causal=False)
    assert launched() == [] and hopper._FUSED_FAILED == set()
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "auto")
    with pytest.warns(RuntimeWarning, match="five-product Gluon backward .* failed to build"):
        run()
    assert launched() == ["_dq_kernel", "_dkdv_kernel"]
    assert hopper._FUSED_FAILED == {(128, torch.bfloat16, False)}
    run()  # remembered: straight to the seven-product kernels, no second warning
    assert len(launched()) == 4


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_the_fused_backward_runs_where_measured_and_never_when_asked_for_the_same_bits(monkeypatch):
    def takes(head_dim=128, causal=False, deterministic=False, call_head_dim=None):
        """Whether a (1, 16, 16384, call_head_dim) q on the kernels of ``head_dim`` takes it."""
        q = torch.empty(1, 1, 1, call_head_dim or head_dim, dtype=torch.bfloat16).expand(1, 16, 16384, -1)
        return hopper._takes_fused(q, head_dim, causal, 16384, deterministic)

    monkeypatch.setattr(hopper._gluon_common(), "HAS_TMA_REDUCE", True)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD_FUSED", raising=False)
    assert hopper.FUSED_UNDER_AUTO  # on since the epilogue's barrier ran on the H200 (session 13)
    # every length at d64 and d128, causal or not (d64 causal since session 31, d128 causal since 33)
    assert takes() and takes(causal=True) and takes(head_dim=64) and takes(head_dim=64, causal=True)
    assert not takes(head_dim=256)  # no d256 kernel
    assert not takes(deterministic=True)
    assert not takes(call_head_dim=96)  # the d128 kernel over zero columns: not timed so
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not takes()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert takes()
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "1")
    assert takes(head_dim=64) and takes(causal=True) and not takes(deterministic=True)
    assert takes(call_head_dim=96) and takes(head_dim=64, call_head_dim=40)
    assert not takes(head_dim=256)
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "0")
    assert not takes()
    # Triton 3.6 or 3.7: the reduction a TMA store rewritten in the PTX, under auto only where
    # PTX_REDUCE_UNDER_AUTO (then as measured), and wherever it runs under 1
    monkeypatch.setattr(hopper._gluon_common(), "HAS_TMA_REDUCE", False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD_FUSED")
    monkeypatch.setattr(hopper, "PTX_REDUCE_UNDER_AUTO", False)
    assert not takes()
    monkeypatch.setattr(hopper, "PTX_REDUCE_UNDER_AUTO", True)
    assert takes() and takes(causal=True) and not takes(deterministic=True)
    monkeypatch.setattr(hopper, "PTX_REDUCE_UNDER_AUTO", False)
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", "1")
    assert takes() and takes(head_dim=64, causal=True) and not takes(deterministic=True)


def test_deterministic_reaches_the_backward_op(monkeypatch):
    # The backward runs later than the call that asked: the flag must travel with the autograd
    # node to flashtile::attention_backward (whose Gluon path hands it to hopper.backward).
    from flashtile import ops

    seen = []

    def recorded(op):
        def record(*args):
            seen.append(args[-1])
            return op(*args)
        return record

    # (the op, or in plain eager calls its body: ops._call_directly)
    for name in ("attention_backward", "_attention_backward"):
        monkeypatch.setattr(ops, name, recorded(getattr(ops, name)))
    q, k, v = (torch.randn(1, 17, 2, 16, requires_grad=True) for _ in range(3))
    for face, flag in ((flashtile.attention, True), (flashtile.attention, False), (flashtile.flash_attn_func, True),
                       (flashtile.flash_attn_func, False)):
        face(q, k, v, causal=True, deterministic=flag).sum().backward()
    flashtile.attention(q, k, v).sum().backward()
    assert seen == [True, False, True, False, False]


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_the_gluon_forward_hands_its_kernel_descriptors_of_its_own_tiles(monkeypatch, head_dim):
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "0")  # a program per Q tile (persistent: below)
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, "2")  # two consumers: 128-row tiles at d64 too
    launches = _recorded_forward_launches(monkeypatch)
    q, out = (torch.randn(2, 6, 300, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, 333, head_dim, dtype=torch.bfloat16) for _ in range(2))
    lse = hopper.forward(q, k, v, out, head_dim ** -0.5, causal=False)
    assert lse.shape == (2, 6, 300)
    ((_, grid, args, constexprs),) = launches
    width = hopper.kernel_head_dim(head_dim)
    assert constexprs["HEAD_DIM"] == width
    q_desc, k_desc, v_desc, o_desc = args[:4]
    assert [d.base for d in (q_desc, k_desc, v_desc, o_desc)] == [q, k, v, out]
    half = constexprs["BLOCK_M"] // 2
    assert q_desc.block_shape == o_desc.block_shape == [1, 1, half, width]
    assert k_desc.block_shape == v_desc.block_shape == [1, 1, constexprs["BLOCK_N"], width]
    assert grid == (triton.cdiv(300, constexprs["BLOCK_M"]) * 2 * 6,)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_a_repeated_forward_launches_from_its_plan_with_the_new_tensors(monkeypatch):
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "0")  # a program per Q tile (persistent: below)
    monkeypatch.delenv(hopper.FORWARD_CONSUMERS_SWITCH, raising=False)
    launches = _recorded_forward_launches(monkeypatch)

    def call(seqlen_k=333, causal=True, scale=0.125):
        q, out = (torch.randn(2, 6, 300, 128, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(2, 2, seqlen_k, 128, dtype=torch.bfloat16) for _ in range(2))
        hopper.forward(q, k, v, out, scale, causal=causal)
        _, grid, args, constexprs = launches[-1]
        assert [d.base for d in args[:4]] == [q, k, v, out]  # this call's tensors, never the plan's first
        lse = args[4]
        assert args[5:7] == lse.stride()[:2]
        return grid, args[5:], constexprs, [d.block_shape for d in args[:4]]

    first = call()
    assert len(hopper._DENSE_FORWARD_PLANS) == 1
    assert call() == first  # the plan's launch: the same grid, arguments, constexprs and tiles
    assert len(hopper._DENSE_FORWARD_PLANS) == 1
    # each thing the plan is worked out from is in its key: another length, causality or scale ...
    assert call(seqlen_k=4096)[2]["NUM_STAGES"] == 3 and call(causal=False)[2]["CAUSAL"] is False
    assert call(scale=0.25)[1][-2:] == (0.25 * hopper.LOG2E, None)  # (no dynamic scheduler's counter)
    # ... and the module settings it read: a probe's tiles or L2 budget take effect at once
    monkeypatch.setattr(hopper, "_config", lambda head_dim, seqlen_k: (64, 4))
    assert (call()[2]["BLOCK_N"], call()[2]["NUM_STAGES"]) == (64, 4)
    monkeypatch.setattr(hopper, "CAUSAL_L2_BYTES", 0)
    assert call()[1][7] == 1  # heads per group: the plain order
    monkeypatch.setitem(hopper.FORWARD_OVERLAP, 2, False)
    assert call()[2]["OVERLAP"] is False  # each tile's products in turn (a probe's variant)
    # ... and the four consumers' tiles and registers (probes/fwd_consumers.py --four swaps both)
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, "4")

    def four():
        q, out = (torch.randn(1, 2, 300, 64, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, 2, 333, 64, dtype=torch.bfloat16) for _ in range(2))
        hopper.forward(q, k, v, out, 0.125, causal=True)
        constexprs = launches[-1][3]
        return constexprs["CONSUMERS"], constexprs["BLOCK_N"], constexprs["NUM_STAGES"], constexprs["CONSUMER_REGS"]

    assert four() == (4, *hopper.FORWARD_FOUR_CONSUMER_TILES, hopper.FORWARD_CONSUMER_REGS[4])
    monkeypatch.setattr(hopper, "FORWARD_FOUR_CONSUMER_TILES", (64, 2))
    monkeypatch.setitem(hopper.FORWARD_CONSUMER_REGS, 4, 104)
    assert four() == (4, 64, 2, 104)
    monkeypatch.delenv(hopper.FORWARD_CONSUMERS_SWITCH)
    # Where Triton's descriptors could not be copied (no template), each call builds its own.
    monkeypatch.setattr(hopper, "_tile_template", lambda t, rows, width: None)
    assert call(scale=0.5) == call(scale=0.5)
    assert all(plan.templates is None for key, plan in hopper._DENSE_FORWARD_PLANS.items() if key[7] == 0.5)


def test_three_consumer_warpgroups_run_at_d64_unless_the_switch_says_two(monkeypatch):
    monkeypatch.delenv(hopper.FORWARD_CONSUMERS_SWITCH, raising=False)
    # auto: three at kernel head dim 64 (1.03-1.11x two on the H200 where auto runs it, session 24)
    assert [hopper.forward_consumers(d) for d in (64, 128, 256)] == [3, 2, 2]
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, "3")
    assert [hopper.forward_consumers(d) for d in (64, 128, 256)] == [3, 2, 2]
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, "2")
    assert [hopper.forward_consumers(d) for d in (64, 128, 256)] == [2, 2, 2]
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, "4")
    assert [hopper.forward_consumers(d) for d in (64, 128, 256)] == [4, 2, 2]
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, "three")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_FWD_CONSUMERS: expected auto, 2, 3 or 4, got 'three'"):
        hopper.forward_consumers(64)
    # a three- or four-consumer kernel that fails to build is remembered apart from the two-consumer one
    q = torch.empty(1, 2, 16, 40, dtype=torch.bfloat16)
    keys = {}
    for value in ("2", "3", "4"):
        monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, value)
        keys[value] = hopper._failure_key(False, q, causal=True)
    assert keys["2"][0] == "forward" and keys["3"][0] == "three-consumer forward"
    assert keys["4"][0] == "four-consumer forward"
    assert hopper._failure_key(True, q, causal=True)[0] == "backward"  # the backward has no such variant


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("consumers", [3, 4])
@pytest.mark.parametrize("head_dim", [40, 64, 128])
def test_three_or_four_consumers_launch_tiles_of_64_row_parts(monkeypatch, head_dim, consumers):
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "0")  # a program per Q tile (persistent: below)
    launches = _recorded_forward_launches(monkeypatch)
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, str(consumers))
    q, out = (torch.randn(2, 6, 500, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, 333, head_dim, dtype=torch.bfloat16) for _ in range(2))
    hopper.forward(q, k, v, out, head_dim ** -0.5, causal=True)
    ((_, grid, args, constexprs),) = launches
    width = hopper.kernel_head_dim(head_dim)
    q_desc, k_desc, v_desc, o_desc = args[:4]
    assert q_desc.block_shape == o_desc.block_shape == [1, 1, 64, width]
    if width == 64:  # three or four consumers of 64 rows, on their own K/V tiles, each tile's products in turn
        assert constexprs["CONSUMERS"] == consumers and constexprs["BLOCK_M"] == 64 * consumers
        tiles = hopper.FORWARD_THREE_CONSUMER_TILES if consumers == 3 else hopper.FORWARD_FOUR_CONSUMER_TILES
        assert (constexprs["BLOCK_N"], constexprs["NUM_STAGES"]) == tiles
        assert constexprs["CONSUMER_REGS"] == hopper.FORWARD_CONSUMER_REGS[consumers]
        assert constexprs["OVERLAP"] is False and hopper.FORWARD_OVERLAP[consumers] is False
    else:  # other head dims keep two (and the launch as before: no CONSUMERS or OVERLAP argument)
        assert "CONSUMERS" not in constexprs and "OVERLAP" not in constexprs and constexprs["BLOCK_M"] == 128
    assert k_desc.block_shape == v_desc.block_shape == [1, 1, constexprs["BLOCK_N"], width]
    assert grid == (triton.cdiv(500, constexprs["BLOCK_M"]) * 2 * 6,)


def test_spread_programs_share_no_factor_with_the_tiles_of_a_head_at_no_cost_in_turns():
    # d64 at 1k: 6 Q tiles a head, 512 heads (3072 items) on 132 SMs -> 131 (24 turns either way);
    # 4k: 22 tiles, 2816 items -> 131 (22 turns); 16k: 86 tiles, 2752 items, 21 turns on 132 and 22 on
    # 131 -> kept; coprime already: kept
    assert [hopper.spread_programs(132, tiles, items) for tiles, items in ((6, 3072), (22, 2816), (86, 2752))] \
        == [131, 131, 132]
    assert hopper.spread_programs(132, 7, 3072) == 132
    # 48 items on 12 programs take 4 turns; 11 would take 5, so 12 stay
    assert hopper.spread_programs(12, 6, 48) == 12 and hopper.spread_programs(12, 6, 50) == 11
    for programs in range(1, 150):
        for tiles in (2, 3, 6, 8, 22):
            for items in (programs + 1, 3 * programs + 2, 7 * programs):
                spread = hopper.spread_programs(programs, tiles, items)
                turns = -(-items // spread)
                assert 1 <= spread <= programs and turns == -(-items // programs)
                if spread < programs:
                    assert math.gcd(spread, tiles) == 1
                    assert all(math.gcd(p, tiles) > 1 for p in range(spread + 1, programs + 1))
                else:  # kept: coprime already, or no coprime count takes as few turns
                    assert math.gcd(programs, tiles) == 1 or all(
                        math.gcd(p, tiles) > 1 for p in range(1, programs) if -(-items // p) == turns)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_spread_takes_a_program_count_coprime_with_the_tiles_where_the_last_tile_has_idle_parts(monkeypatch):
    launches = _recorded_forward_launches(monkeypatch)
    monkeypatch.setattr(hopper, "sm_count", lambda device: 12)  # a pretend GPU of 12 SMs
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "1")
    monkeypatch.delenv(hopper.FORWARD_CONSUMERS_SWITCH, raising=False)  # d64: three, 192-row tiles

    def programs(seqlen, causal=False, spread="1", nine=False):
        monkeypatch.setenv(hopper.SPREAD_SWITCH, spread)
        shape = (1, 9, seqlen, 64) if nine else (2, 4, seqlen, 64)
        q, k, v, out = (torch.randn(shape, dtype=torch.bfloat16) for _ in range(4))
        hopper.forward(q, k, v, out, 0.125, causal=causal)
        return launches[-1][1][0]

    # 1000 rows: 6 tiles a head (the last with one live part of three) on 12 programs, which share
    # the factor 6. Batch 2 of 4 heads (48 tiles, 4 turns) keeps 12, as 11 would take 5 turns; one
    # of 9 heads (54 tiles, 5 turns either way) takes 11; off (the switch, or auto as measured), 12.
    assert programs(1000) == 12
    assert programs(1000, nine=True) == 11 and programs(1000, nine=True, spread="0") == 12
    assert programs(1000, nine=True, spread="auto") == (11 if hopper.PERSISTENT_SPREAD else 12)
    assert programs(1152, nine=True) == 12  # 6 whole tiles a head: nothing idles, nothing to spread
    # causal tiles differ in cost (and past 1k keys take the dynamic scheduler): not spread
    assert programs(1000, nine=True, causal=True) == 12
    monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", True)  # a dynamic scheduler balances the tiles itself
    assert programs(1000, nine=True) == 12
    monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", None)
    assert programs(100) == 8  # a tile a head, 8 in all: a program each


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_early_coords_go_to_persistent_launches_only_and_only_when_on(monkeypatch):
    # FLASHTILE_GLUON_FWD_EARLY_COORDS (attempt 77): the consumers read each item's coordinates from
    # the loader (gluon_fwd's EARLY_COORDS). Under auto for causal calls on the d64 kernel (session
    # 32); passed only when on, so other launches keep their arguments and fast_launch key; a program
    # per Q tile never takes it.
    launches = _recorded_forward_launches(monkeypatch)
    monkeypatch.setattr(hopper, "sm_count", lambda device: 7)  # a pretend GPU of 7 SMs
    monkeypatch.delenv(hopper.FORWARD_CONSUMERS_SWITCH, raising=False)

    def launch(early, persistent="1", causal=False, head_dim=64):
        monkeypatch.setenv(hopper.EARLY_COORDS_SWITCH, early)
        monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, persistent)
        q, k, v, out = (torch.randn(2, 6, 1000, head_dim, dtype=torch.bfloat16) for _ in range(4))
        hopper.forward(q, k, v, out, 0.125, causal=causal)
        return launches[-1]

    off = launch("0")
    assert "EARLY_COORDS" not in off[3] and off[3]["PERSISTENT"] is True
    # auto: the table's entry (session 32: causal d64 only)
    assert "EARLY_COORDS" not in launch("auto")[3] and hopper.PERSISTENT_EARLY_COORDS == {(64, True): True}
    assert launch("auto", causal=True)[3]["EARLY_COORDS"] is True
    assert "EARLY_COORDS" not in launch("auto", causal=True, head_dim=128)[3]
    for dynamic in (False, True):  # fixed turns and the dynamic scheduler (its counter passed as before)
        monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", dynamic)
        for causal in (False, True):
            for head_dim in (64, 128, 256):
                on = launch("1", causal=causal, head_dim=head_dim)
                assert on[3]["EARLY_COORDS"] is True and on[3]["PERSISTENT"] is True
                assert (on[2][-1] is not None) is dynamic
    monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", None)
    # the same launch but for the constexpr: grid, scalars and every other constexpr (a new plan, not
    # the switch's other one: the plans' key holds the setting)
    on = launch("1")
    assert on[1] == off[1] and on[2][5:] == off[2][5:] and len(on[2]) == len(off[2]) == 15
    assert {key: value for key, value in on[3].items() if key != "EARLY_COORDS"} == off[3]
    assert "EARLY_COORDS" not in launch("0")[3]
    assert "EARLY_COORDS" not in launch("1", persistent="0")[3]  # a program per Q tile: nothing to carry
    monkeypatch.setattr(hopper, "PERSISTENT_EARLY_COORDS", {(64, False): True})  # what auto follows
    assert launch("auto")[3]["EARLY_COORDS"] is True and "EARLY_COORDS" not in launch("0")[3]
    assert "EARLY_COORDS" not in launch("auto", causal=True)[3]
    monkeypatch.setenv(hopper.EARLY_COORDS_SWITCH, "2")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_FWD_EARLY_COORDS: expected one of auto, 1, 0, got '2'"):
        hopper.forward(*(torch.randn(1, 2, 100, 64, dtype=torch.bfloat16) for _ in range(4)), 0.125, causal=False)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
@pytest.mark.parametrize("head_dim,seqlen_k,consumers,buffers", [(64, 333, 3, 2), (64, 333, 4, 2), (64, 333, 2, 2),
                                                                 (128, 333, 2, 2), (128, 5000, 2, 1), (256, 333, 2, 1)])
def test_persistent_forward_launches_a_program_per_sm_at_most(monkeypatch, head_dim, seqlen_k, consumers, buffers):
    launches = _recorded_forward_launches(monkeypatch)
    monkeypatch.setattr(hopper, "sm_count", lambda device: 7)  # a pretend GPU of 7 SMs
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, str(consumers))
    q, out = (torch.randn(2, 6, 300, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, seqlen_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    tiles = triton.cdiv(300, 64 * consumers) * 2 * 6
    for switch in ("0", "1"):
        monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, switch)
        hopper.forward(q, k, v, out, 0.125, causal=True)
    (_, per_tile, _, plain), (_, persistent, args, constexprs) = launches
    assert per_tile == (tiles,) and "PERSISTENT" not in plain  # a program per Q tile, the launch as before
    assert persistent == (7,) and constexprs["PERSISTENT"] is True
    # the next tile's Q in a second buffer where it fits beside the K/V ring (d256's ring and a
    # 3-stage d128 ring leave no room for it)
    assert constexprs["Q_BUFFERS"] == buffers == hopper.forward_q_buffers(
        hopper.kernel_head_dim(head_dim), constexprs["BLOCK_M"], constexprs["BLOCK_N"], constexprs["NUM_STAGES"])
    # (and, causal at d64, each item's coordinates from the loader: PERSISTENT_EARLY_COORDS)
    assert constexprs.get("EARLY_COORDS", False) == (hopper.kernel_head_dim(head_dim) == 64)
    assert {key: value for key, value in constexprs.items()
            if key not in ("PERSISTENT", "Q_BUFFERS", "EARLY_COORDS")} == plain
    # the early K/V copies (PERSISTENT_EARLY_KV) go to launches of one Q buffer only
    monkeypatch.setattr(hopper, "PERSISTENT_EARLY_KV", True)
    hopper.forward(q, k, v, out, 0.125, causal=True)
    assert launches[-1][3].get("EARLY_KV", False) is (buffers == 1)
    monkeypatch.setattr(hopper, "PERSISTENT_EARLY_KV", False)
    # fewer tiles than SMs: a program each
    monkeypatch.setattr(hopper, "sm_count", lambda device: 1000)
    hopper.forward(q, k, v, out, 0.125, causal=True)
    assert launches[-1][1] == (tiles,)
    monkeypatch.setattr(hopper, "sm_count", lambda device: 7)
    # the dynamic scheduler (PERSISTENT_DYNAMIC): a zeroed int32 counter, new for each launch;
    # by default for causal programs past 1k keys only, whose tiles' work differs
    auto = seqlen_k > 1024
    for dynamic, schedules in ((None, (auto, auto, False)), (True, (True, True, True)), (False, (False,) * 3)):
        monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", dynamic)
        counters = []
        for causal, scheduled in zip((True, True, False), schedules):
            hopper.forward(q, k, v, out, 0.125, causal=causal)
            counter = launches[-1][2][-1]
            if scheduled:
                assert counter.dtype == torch.int32 and counter.tolist() == [0]
            else:
                assert counter is None
            counters.append(counter)
        assert counters[0] is None or counters[0] is not counters[1]
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "yes")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_FWD_PERSISTENT: expected auto, 0 or 1, got 'yes'"):
        hopper.forward(q, k, v, out, 0.125, causal=True)


def test_persistent_programs_run_under_auto_where_they_were_measured_faster(monkeypatch):
    monkeypatch.delenv(hopper.FORWARD_PERSISTENT_SWITCH, raising=False)
    # causal rows at every length (d256 past 1k keys), on the dynamic scheduler past 1k keys;
    # non-causal, short rows at d64 and d128 (to 4k keys), never at d256
    assert all(hopper.forward_persistent(d, n, causal=True) for d in (64, 128, 256) for n in (1025, 4096, 16384))
    assert hopper.forward_persistent(128, 1024, causal=True) and not hopper.forward_persistent(256, 1024, True)
    assert hopper.persistent_dynamic(True, 1025) and not hopper.persistent_dynamic(True, 1024)
    assert not hopper.persistent_dynamic(False, 16384)
    assert hopper.forward_persistent(64, 4096, causal=False) and hopper.forward_persistent(128, 1024, causal=False)
    assert not hopper.forward_persistent(128, 4097, causal=False) and not hopper.forward_persistent(64, 16384, False)
    assert not hopper.forward_persistent(256, 1024, causal=False)
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "0")
    assert not hopper.forward_persistent(64, 1024, causal=True)
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "1")
    assert hopper.forward_persistent(256, 16384, causal=True)


def test_causal_grids_group_heads_whose_streamed_tensors_fit_the_l2_budget(monkeypatch):
    monkeypatch.setattr(hopper, "CAUSAL_L2_BYTES", 16 * 2 ** 20)
    # without a causal mask every tile carries the same work: rows one after the other
    assert hopper.causal_heads_per_group(False, 64, 4096, 128, 2) == 1
    # d128 at 4k keys: K and V of a head take 2 MiB, so 8 heads share 16 MiB
    assert hopper.causal_heads_per_group(True, 64, 4096, 128, 2) == 8
    # a kv head's K/V serve its whole GQA group; a dK/dV row streams Q and dO of the group's heads
    assert hopper.causal_heads_per_group(True, 64, 4096, 128, 2, shared_by=2) == 15  # 16: Triton's own class
    assert hopper.causal_heads_per_group(True, 64, 4096, 128, 2, shared_by=4) == 31
    assert hopper.causal_heads_per_group(True, 16, 4096, 128, 2, streams_for=4) == 2
    # never more than the grid's rows, never fewer than one
    assert hopper.causal_heads_per_group(True, 6, 1024, 64, 2) == 6
    assert hopper.causal_heads_per_group(True, 16, 65536, 256, 2) == 1
    monkeypatch.setattr(hopper, "CAUSAL_L2_BYTES", 0)  # off: the plain order
    assert hopper.causal_heads_per_group(True, 64, 1024, 64, 2) == 1
    monkeypatch.setattr(hopper, "CAUSAL_L2_BYTES", 8.5 * 2 ** 20)  # a float budget still gives an int
    assert hopper.causal_heads_per_group(True, 64, 4096, 128, 2) == 4


def test_head_dims_between_the_kernels_run_padded_and_under_auto_where_timed():
    assert [hopper.kernel_head_dim(d) for d in (8, 40, 64, 80, 96, 128, 160, 192, 256)] == \
        [64, 64, 64, 128, 128, 128, 256, 256, 256]
    assert hopper.kernel_head_dim(264) is None
    # Timed in sessions 12 and 13 (probes/padded_head_dims.py): d96 and d192 ahead of the Triton
    # kernels both ways but for the d192 causal forward below 4k keys; d40 far ahead both ways;
    # other head dims not timed.
    for head_dim in (40, 96, 192):
        assert hopper.measured_faster(head_dim, 16384, backward=False)
        assert hopper.measured_faster(head_dim, 1024, backward=False)
    assert hopper.measured_faster(96, 1024, backward=False, causal=True)
    assert not hopper.measured_faster(192, 1024, backward=False, causal=True)
    assert hopper.measured_faster(192, 4096, backward=False, causal=True)
    assert hopper.measured_faster(96, 1024, backward=True) and hopper.measured_faster(192, 16384, backward=True)
    assert hopper.measured_faster(40, 1024, backward=True, causal=True) and hopper.measured_faster(40, 16384, True)
    for head_dim in (8, 80, 112, 160, 224):
        assert not hopper.measured_faster(head_dim, 16384, backward=False)
        assert not hopper.measured_faster(head_dim, 16384, backward=True)


GRID = [
    (dtype, d, sq_sk, causal)
    for dtype, d, sq_sk, causal in itertools.product(
        [torch.bfloat16, torch.float16], [64, 128, 256],
        [(1, 1), (17, 17), (113, 203), (203, 113), (128, 128), (1023, 1023), (4097, 1024), (1, 1023), (1023, 17),
         (256, 4097)],
        [False, True])
] + [  # head dims between the kernels' widths, run on the next one over zero columns
    (torch.bfloat16, d, sq_sk, causal)
    for d, sq_sk, causal in itertools.product(
        [40, 96, 192], [(17, 17), (113, 203), (1023, 1023), (256, 4097)], [False, True])
]


def _case_id(case) -> str:
    dtype, head_dim, (seqlen_q, seqlen_k), causal = case
    return f"{str(dtype)[6:]}-d{head_dim}-q{seqlen_q}k{seqlen_k}-{'causal' if causal else 'full'}"


# A copy that never lands would hang the kernel on its barrier: a timeout turns that into a failure.
@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", GRID,
                         ids=[_case_id(case) for case in GRID])
def test_gpu_gluon_forward_grid(gluon_calls, dtype, headdim, seqlens, causal):
    sq, sk = seqlens
    index = GRID.index((dtype, headdim, seqlens, causal))
    heads_q, heads_kv = [(8, 1), (8, 2), (4, 4)][index % 3]  # GQA ratios rotate through the grid
    layout = ["bshd", "bhsd"][(index // 3) % 2]
    check_case(2 if sq * sk <= 1024 * 1024 else 1, sq, sk, heads_q, heads_kv, headdim, dtype, causal=causal,
               layout=layout, bhsd_as_view=index % 4 < 2)
    assert gluon_calls, "the call did not take the Gluon forward"


# FLASHTILE_GLUON_FWD_CONSUMERS: the d64 forward on three consumer warpgroups (192-row tiles; auto
# too), on two (128-row tiles) and on four (256-row tiles of 64 keys), each chosen by the switch.
GRID_THREE = [case for case in GRID if hopper.kernel_head_dim(case[1]) == 64]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("consumers", [3, 2, 4], ids=["three-consumers", "two-consumers", "four-consumers"])
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", GRID_THREE, ids=[_case_id(case) for case in GRID_THREE])
def test_gpu_gluon_forward_on_three_consumers_or_two_or_four(gluon_calls, monkeypatch, dtype, headdim, seqlens,
                                                             causal, consumers):
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, str(consumers))
    chosen = []  # what hopper.forward chose: the consumers asked for, not a silent other count
    choose = hopper.forward_consumers
    monkeypatch.setattr(hopper, "forward_consumers", lambda head_dim: chosen.append(choose(head_dim)) or chosen[-1])
    sq, sk = seqlens
    index = GRID_THREE.index((dtype, headdim, seqlens, causal))
    heads_q, heads_kv = [(8, 1), (8, 2), (4, 4)][index % 3]
    layout = ["bshd", "bhsd"][(index // 3) % 2]
    check_case(2 if sq * sk <= 1024 * 1024 else 1, sq, sk, heads_q, heads_kv, headdim, dtype, causal=causal,
               layout=layout, bhsd_as_view=index % 4 < 2)
    assert gluon_calls, "the call did not take the Gluon forward"
    assert consumers in chosen and set(chosen) <= {consumers}, f"the forward chose {chosen} consumer warpgroups"


def _recorded_plans(monkeypatch) -> list:
    """The dense forward plans hopper.forward launches from, appended as the test's calls make or find them."""
    plans = []
    make_plan = hopper._dense_forward_plan
    monkeypatch.setattr(hopper, "_dense_forward_plan", lambda *args: plans.append(make_plan(*args)) or plans[-1])
    return plans


# FLASHTILE_GLUON_FWD_PERSISTENT=1: a program per SM, each taking several Q tiles. Every head dim's
# kernel, with more Q tiles than the H200's 132 SMs in the larger cases (so programs take several,
# across heads and batches, the ring's phases running on from one tile to the next: 333 keys make
# an odd count of K/V tiles a Q tile, and 4097 keys d128's 3 stages with one Q buffer).
GRID_PERSISTENT = [case for case in GRID if case[2] in ((113, 203), (1023, 1023), (4097, 1024), (1, 1023))] + [
    (dtype, d, sq_sk, causal)
    for dtype, d, sq_sk, causal in itertools.product(
        [torch.bfloat16], [64, 128, 256], [(4097, 333), (1023, 4097)], [False, True])]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", GRID_PERSISTENT,
                         ids=[_case_id(case) for case in GRID_PERSISTENT])
@pytest.mark.parametrize("consumers", ["auto", "2", "4"], ids=["consumers-auto", "two-consumers", "four-consumers"])
# (early-kv: with one Q buffer, the next tile's first K/V tiles copied before the wait for it)
@pytest.mark.parametrize("schedule,early_kv", [("turns", False), ("dynamic", False), ("dynamic", True),
                                              ("turns", True)],
                         ids=["turns", "dynamic", "early-kv", "turns-early-kv"])
def test_gpu_gluon_forward_on_persistent_programs(gluon_calls, monkeypatch, dtype, headdim, seqlens, causal, schedule,
                                                  early_kv, consumers):
    if consumers != "auto" and hopper.kernel_head_dim(headdim) != 64:
        pytest.skip("two or four consumers differ from auto's count at d64 only")
    if consumers == "2" and schedule != "turns":
        pytest.skip("two consumers run in fixed turns here; auto's three take the dynamic scheduler")
    if early_kv and hopper.kernel_head_dim(headdim) == 64:
        pytest.skip("d64 has two Q buffers: the early K/V copies are for one")
    monkeypatch.setattr(hopper, "PERSISTENT_EARLY_KV", early_kv)
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "1")
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, consumers)
    monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", schedule == "dynamic")
    plans = _recorded_plans(monkeypatch)  # persistent programs, not a silent program per tile
    sq, sk = seqlens
    index = GRID_PERSISTENT.index((dtype, headdim, seqlens, causal))
    heads_q, heads_kv = [(8, 1), (8, 2), (4, 4)][index % 3]
    layout = ["bshd", "bhsd"][(index // 3) % 2]
    # (the float64 oracle's scores beside 11 other workers: 2 x 16 heads x 4097 x 1024 ran out of memory)
    batch = 3 if sq * sk <= 1024 * 1024 else 2 if sq * sk <= 2048 * 1024 else 1
    check_case(batch, sq, sk, heads_q * 2, heads_kv * 2, headdim, dtype, causal=causal, layout=layout,
               bhsd_as_view=index % 4 < 2)
    assert gluon_calls, "the call did not take the Gluon forward"
    assert plans and all(plan.constexprs.get("PERSISTENT") for plan in plans), "not on persistent programs"
    if consumers != "auto":  # the count asked for, not a silent other one
        assert all(plan.constexprs.get("CONSUMERS", 2) == int(consumers) for plan in plans)
    assert all(plan.dynamic is (schedule == "dynamic") for plan in plans)
    assert all(plan.constexprs.get("EARLY_KV", False) is (early_kv and plan.constexprs["Q_BUFFERS"] == 1)
               for plan in plans)


# Under causal a head's Q tiles start the overhang's whole parts before its first row
# (q_tile_of_program's LEAD_PART): shapes where every tile height (256, 192 and 128 rows) shifts by
# parts over several Q tiles with fewer queries than keys (1025 rows: three parts of a 256-row tile,
# the most it can shift), and the 4096 rows that shift d64's 192-row tiles by two parts over 22
# tiles (256 rows divide it), on each way the forward's programs take their tiles.
OVERHANG_SHAPES = [(1025, 4097), (129, 333), (4096, 4096)]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("seqlens", OVERHANG_SHAPES, ids=[f"q{sq}k{sk}" for sq, sk in OVERHANG_SHAPES])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("programs", ["per-tile", "turns", "dynamic"])
@pytest.mark.parametrize("consumers", ["auto", "2", "4"], ids=["consumers-auto", "two-consumers", "four-consumers"])
def test_gpu_gluon_causal_forward_with_the_overhang_in_front(gluon_calls, monkeypatch, seqlens, headdim, programs,
                                                             consumers):
    if consumers != "auto" and headdim != 64:
        pytest.skip("two or four consumers differ from auto's count at d64 only")
    monkeypatch.setenv(hopper.FORWARD_CONSUMERS_SWITCH, consumers)
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "0" if programs == "per-tile" else "1")
    monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", programs == "dynamic")
    plans = _recorded_plans(monkeypatch)  # the consumers asked for
    sq, sk = seqlens
    check_case(1 if sq * sk > 2048 * 1024 else 2, sq, sk, 4, 2, headdim, torch.bfloat16, causal=True,
               layout="bshd" if headdim == 128 else "bhsd")
    assert gluon_calls, "the call did not take the Gluon forward"
    if consumers != "auto":
        assert plans and all(plan.constexprs.get("CONSUMERS", 2) == int(consumers) for plan in plans)


# FLASHTILE_GLUON_FWD_EARLY_COORDS=1 (attempt 77): the persistent programs' consumers read each item's
# coordinates from the slots the loader fills beside its Q. The persistent and overhang tests above,
# forced on (their names left out of FORWARD_SELECTION's words: gpu_final.sh early-coords runs these).
@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", GRID_PERSISTENT,
                         ids=[_case_id(case) for case in GRID_PERSISTENT])
@pytest.mark.parametrize("consumers", ["auto", "2", "4"], ids=["consumers-auto", "two-consumers", "four-consumers"])
@pytest.mark.parametrize("schedule", ["turns", "dynamic"])
def test_gpu_gluon_forward_early_coords(gluon_calls, monkeypatch, dtype, headdim, seqlens, causal, schedule,
                                        consumers):
    monkeypatch.setenv(hopper.EARLY_COORDS_SWITCH, "1")
    plans = _recorded_plans(monkeypatch)
    test_gpu_gluon_forward_on_persistent_programs(gluon_calls, monkeypatch, dtype, headdim, seqlens, causal,
                                                  schedule, False, consumers)
    assert plans and all(plan.constexprs.get("EARLY_COORDS") is True for plan in plans), "the coordinates not early"


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("seqlens", OVERHANG_SHAPES, ids=[f"q{sq}k{sk}" for sq, sk in OVERHANG_SHAPES])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("programs", ["turns", "dynamic"])
@pytest.mark.parametrize("consumers", ["auto", "2", "4"], ids=["consumers-auto", "two-consumers", "four-consumers"])
def test_gpu_gluon_causal_forward_early_coords_lead_parts(gluon_calls, monkeypatch, seqlens, headdim, programs,
                                                          consumers):
    # (q_start below 0 in a head's first tile: the lead's parts, through an int32 slot)
    monkeypatch.setenv(hopper.EARLY_COORDS_SWITCH, "1")
    plans = _recorded_plans(monkeypatch)
    test_gpu_gluon_causal_forward_with_the_overhang_in_front(gluon_calls, monkeypatch, seqlens, headdim, programs,
                                                             consumers)
    assert plans and all(plan.constexprs.get("EARLY_COORDS") is True for plan in plans), "the coordinates not early"


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
def test_gpu_gluon_forward_leaves_what_it_does_not_cover_to_triton(gluon_calls):
    q, k, v = (torch.randn(1, 300, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for options in (dict(softcap=20.0), dict(window_size=(64, 0)), dict(causal=True, dropout_p=0.1)):
        flashtile.attention(q, k, v, **options)
    flashtile.attention(q.float(), k.float(), v.float())
    assert gluon_calls == []
    flashtile.attention(q, k, v, causal=True)
    assert gluon_calls == [(1, 4, 300, 128)]  # the head-major view the launch sees


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernels are built for sm_90")
def test_gpu_by_default_gluon_runs_where_it_was_measured_faster(monkeypatch):
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    forwards, backwards = _count_calls(monkeypatch, "forward"), _count_calls(monkeypatch, "backward")
    for seqlen, head_dim in ((1000, 64), (1000, 128), (4100, 64), (4100, 128)):
        q, k, v = (torch.randn(1, seqlen, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        flashtile.attention(q, k, v, causal=True).sum().backward()
    assert forwards == [(1, 2, 1000, 128), (1, 2, 4100, 64), (1, 2, 4100, 128)]
    assert backwards == [(1, 2, 1000, 64), (1, 2, 1000, 128), (1, 2, 4100, 64), (1, 2, 4100, 128)]
    assert hopper._FAILED == set(), "a Gluon kernel failed to build and fell back to Triton"


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernels are built for sm_90")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads_per_group", [2, 3])
@pytest.mark.parametrize("fused", ["0", "auto"], ids=["seven", "auto"])
def test_gpu_causal_grids_in_groups_of_heads_visit_every_tile_once(monkeypatch, head_dim, heads_per_group, fused):
    # The causal grids run their (batch, head) rows in groups, heaviest tiles first
    # (gluon_common.tile_and_row_of_program). Forced groups of 2 and 3: over 12 query-head rows
    # and 4 kv-head rows (2 batches, 6 query heads on 2 kv heads), then 10 and 10 (5 heads);
    # groups of 3 leave a last group short. A tile mapped twice or never shows as a wrong
    # output or gradient.
    monkeypatch.setenv("FLASHTILE_GLUON", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    monkeypatch.setenv("FLASHTILE_GLUON_BWD_FUSED", fused)
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    groups = []

    def forced(causal, rows, *args, **kwargs):
        groups.append((causal, rows))
        return min(rows, heads_per_group) if causal else 1

    monkeypatch.setattr(hopper, "causal_heads_per_group", forced)
    forwards, backwards = _count_calls(monkeypatch, "forward"), _count_calls(monkeypatch, "backward")
    check_case(2, 700, 777, 6, 2, head_dim, torch.bfloat16, causal=True)
    check_case(2, 450, 450, 5, 5, head_dim, torch.bfloat16, causal=True, layout="bhsd")
    assert len(forwards) == len(backwards) == 2
    # each launch of a dense Gluon kernel asked once: forward, dK/dV (and dQ, or the fused kernel)
    assert (True, 12) in groups and (True, 4) in groups and (True, 10) in groups
    assert hopper._FAILED == set(), "a Gluon kernel failed to build and fell back to Triton"


def _captured(step):
    """(a CUDA graph of ``step()``, the tensors the captured step returned): run once on a side
    stream first, so that the kernels are built outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon forward is built for sm_90")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_dynamic_scheduler_covers_every_tile_in_each_replay(monkeypatch, head_dim, causal):
    # The dynamic scheduler's counter is zeroed by each launch (a memset node when captured): a
    # replay that found it used up would skip every tile. The output starts as NaN, so a tile no
    # program took shows, and each replay's new inputs must give their own oracle's answer.
    monkeypatch.setenv(hopper.FORWARD_PERSISTENT_SWITCH, "1")
    monkeypatch.setattr(hopper, "PERSISTENT_DYNAMIC", True)
    q, k, v = (torch.randn(3, 16, 1000, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    graph, lse = _captured(lambda: hopper.forward(q, k, v, out, head_dim ** -0.5, causal))
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        oracle, oracle_lse = flashtile.naive_attention(q, k, v, causal=causal, layout="bhsd", upcast=True,
                                                       return_lse=True)
        baseline, baseline_lse = flashtile.naive_attention(q, k, v, causal=causal, layout="bhsd", upcast=False,
                                                           return_lse=True)
        assert not out.isnan().any(), "a tile was never computed"
        assert_close_to_oracle("out", out, oracle, baseline)
        assert_close_to_oracle("lse", lse, oracle_lse, baseline_lse.float())


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_forward_and_backward_replay_from_a_cuda_graph(monkeypatch, head_dim):
    # A training step captured once and replayed with new inputs copied in (what
    # torch.compile's "reduce-overhead" and hand-written graphs do): each replay must equal the
    # eager step bit for bit, except dQ where the five-product backward ran (d64 and d128 here, as
    # by default; causal, so on persistent programs from the dynamic scheduler, whose counter each
    # replay zeroes), which adds its tiles' parts in the order they finish: there it must be within
    # the oracle's tolerance (session 22 saw one replay's dQ differ in its last bits). On sm_90 the
    # default forward and backward are Gluon in all three cases.
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.delenv(hopper.FUSED_SWITCH, raising=False)
    seqlen = 4100 if head_dim == 64 else 777
    q, k, v, dout = (torch.randn(1, seqlen, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        out = flashtile.attention(*leaves, causal=True)
        return (out, *torch.autograd.grad(out, leaves, dout))

    taken = []  # whether each backward ran the five-product kernel
    takes_fused = hopper._takes_fused
    monkeypatch.setattr(hopper, "_takes_fused",
                        lambda *args, **kwargs: taken.append(takes_fused(*args, **kwargs)) or taken[-1])
    graph, captured = _captured(step)
    fused = any(taken)
    if ON_HOPPER:  # (what auto takes there: the five-product kernel at d64 and d128, session 33)
        assert taken and fused == (head_dim in (64, 128)), f"five-product backward taken: {taken} at d{head_dim}"
    for _ in range(2):
        for buffer in (*leaves, dout):
            buffer.detach().copy_(torch.randn_like(buffer))
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, eager):
            if name == "dq" and fused:
                expected, plain = (torch.autograd.grad(
                    flashtile.naive_attention(*leaves, causal=True, upcast=upcast), leaves[0], dout)[0]
                    for upcast in (True, False))
                assert_close_to_oracle(name, got, expected, plain, grad=True)
            else:
                assert torch.equal(got, want), name
    assert hopper._FAILED == set(), "a Gluon kernel failed to build and fell back to Triton"


BACKWARD_GRID = GRID  # d256 on gluon_bwd_wide's dK/dV kernel


def _check_backward_case(grid, dtype, headdim, seqlens, causal) -> None:
    """check_case for one case of a backward grid: GQA ratio, layout and strided views rotate
    with the case's place in ``grid``."""
    sq, sk = seqlens
    index = grid.index((dtype, headdim, seqlens, causal))
    heads_q, heads_kv = [(8, 2), (4, 4), (8, 1)][index % 3]
    layout = ["bhsd", "bshd"][(index // 3) % 2]
    check_case(2 if sq * sk <= 1024 * 1024 else 1, sq, sk, heads_q, heads_kv, headdim, dtype, causal=causal,
               layout=layout, bhsd_as_view=index % 4 >= 2)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon backward is built for sm_90")
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", BACKWARD_GRID,
                         ids=[_case_id(case) for case in BACKWARD_GRID])
def test_gpu_gluon_backward_grid(gluon_backward_calls, dtype, headdim, seqlens, causal):
    _check_backward_case(BACKWARD_GRID, dtype, headdim, seqlens, causal)
    assert gluon_backward_calls, "the call did not take the Gluon backward"


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon backward is built for sm_90")
@pytest.mark.parametrize("kernels,head_dim", [("seven", 128), ("seven", 256), ("fused", 64), ("fused", 128)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gluon_backward_with_an_lse_gradient_and_groups_of_three(request, kernels, causal, head_dim):
    # A loss on the LSE shifts D by its gradient (bwd.py's preprocess); 6 query heads share 2 K/V heads.
    # "seven": gluon_bwd's two kernels (gluon_bwd_wide's dK/dV at d256); "fused": gluon_bwd_fused's.
    gluon_backward_calls = request.getfixturevalue("fused_backward_calls" if kernels == "fused"
                                                   else "gluon_backward_calls")
    q = torch.randn(2, 300, 6, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 417, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    weights = torch.randn(2, 6, 300, device="cuda")
    dout = torch.randn(2, 300, 6, head_dim, device="cuda", dtype=torch.bfloat16)

    def gradients(attention, **options):
        out, lse = attention(q, k, v, causal=causal, return_lse=True, **options)
        loss = (lse * weights.to(lse.dtype)).sum() + (out * dout.to(out.dtype)).sum()
        return torch.autograd.grad(loss, (q, k, v))

    grads = gradients(flashtile.attention)
    assert gluon_backward_calls == [(2, 6, 300, head_dim)]
    expected = gradients(flashtile.naive_attention, upcast=True)
    plain = gradients(flashtile.naive_attention, upcast=False)
    for name, g, e, p in zip(("dq", "dk", "dv"), grads, expected, plain):
        assert_close_to_oracle(name, g, e, p, grad=True)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon backward is built for sm_90")
@pytest.mark.parametrize("head_dim", [128, 256])
def test_gpu_gluon_backward_gives_the_same_bits_every_time(gluon_backward_calls, head_dim):
    # Every gradient element has one writer and a fixed order of products, so repeated calls
    # on the same inputs must agree bit for bit; a shared-memory race between the warpgroups
    # (the d256 kernel hands P^T from one to the other) would show up as a difference.
    q = torch.randn(2, 1500, 6, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 1700, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    dout = torch.randn(2, 1500, 6, head_dim, device="cuda", dtype=torch.bfloat16)
    out = flashtile.attention(q, k, v, causal=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(10):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), name
    assert len(gluon_backward_calls) == 11


# The five-product backward (gluon_bwd_fused.py; before Triton 3.8 its reduction is the PTX rewrite
# of tma_reduce_ptx.py, forced here by FLASHTILE_GLUON_BWD_FUSED=1): every head dim it covers, both
# dtypes, the GRID's lengths and GQA ratios; padded head dims (40, 96) on the next width.
FUSED_GRID = [case for case in GRID if case[1] in (64, 128, 40, 96)]
NEEDS_FUSED = pytest.mark.skipif(not ON_HOPPER, reason="the five-product backward is built for sm_90")


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
@pytest.mark.parametrize("dtype,headdim,seqlens,causal", FUSED_GRID, ids=[_case_id(case) for case in FUSED_GRID])
def test_gpu_fused_backward_grid(fused_backward_calls, dtype, headdim, seqlens, causal):
    _check_backward_case(FUSED_GRID, dtype, headdim, seqlens, causal)
    assert fused_backward_calls, "the call did not take the five-product backward"


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
@pytest.mark.parametrize("head_dim", [64, 128, 96])
def test_gpu_fused_backward_with_its_tail_split_matches_the_oracle(fused_backward_calls, monkeypatch, head_dim):
    # The tail split (FLASHTILE_GLUON_BWD_TAIL=1) on small grids: a pretend 5, 3 or 2 SMs and
    # parts of any length, so that the last programs run in parts. First case: 28 programs, the
    # last 3 key tiles in 5 parts each, parts that start inside a query head's Q tiles and run
    # into the next (GQA 6:2); second: key tiles of 1 or 2 steps in 3 parts (empty parts, whose
    # partials are zeros). q longer and shorter than k, bshd and bhsd, head dim 96 on the
    # 128-wide kernel (the conversion's extra columns), against the float64 oracle.
    monkeypatch.setenv(hopper.TAIL_SWITCH, "1")
    monkeypatch.setattr(hopper, "TAIL_MIN_STEPS", 0)
    splits = []
    take = hopper._takes_tail_split
    monkeypatch.setattr(hopper, "_takes_tail_split", lambda *args: (splits.append(take(*args)), splits[-1])[1])
    for sms, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, layout) in (
            (5, (2, 700, 777, 6, 2, "bshd")), (3, (1, 100, 900, 2, 2, "bhsd")), (2, (1, 1000, 300, 3, 3, "bshd"))):
        monkeypatch.setattr(hopper, "sm_count", lambda device, sms=sms: sms)
        check_case(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, torch.bfloat16, layout=layout)
    assert len(fused_backward_calls) == 3 and splits == [(25, 5), (15, 3), (8, 2)], splits


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
@pytest.mark.parametrize("descending", [False, True], ids=["first-first", "last-first"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_fused_backward_visits_causal_q_tiles_in_either_order(fused_backward_calls, monkeypatch, head_dim,
                                                                   descending):
    # hopper.FUSED_Q_DESCENDING picks the order per head dim; both orders at both head dims,
    # whatever the table says: GQA 6:2, q longer and shorter than k (bottom-right diagonal),
    # and a length that ends inside a tile, against the float64 oracle.
    monkeypatch.setitem(hopper.FUSED_Q_DESCENDING, head_dim, descending)
    check_case(2, 700, 777, 6, 2, head_dim, torch.bfloat16, causal=True)
    check_case(1, 900, 333, 6, 2, head_dim, torch.bfloat16, causal=True, layout="bhsd")
    check_case(1, 203, 203, 2, 1, head_dim, torch.float16, causal=True)
    assert len(fused_backward_calls) == 3


# The fused kernel's switches and the settings `auto` does not take everywhere: the dQ staging
# box's other swizzles (measured slower than hopper.DQ_SUM_SWIZZLE; under 32 at d128 the box goes
# out in 8 parts, 2 reduction instructions a warpgroup, which tma_reduce_ptx.check takes), 1 or 2
# of every 4 exponentials by exp2_split's polynomial (masked scores are -inf and must give exactly
# 0), and the lse2 row loaded before the Sᵀ wait or after it (auto: before at d128 and d64 causal).
FUSED_SWITCH_SETTINGS = [(hopper.DQ_SWIZZLE_SWITCH, value) for value in ("0", "32", "64")] + [
    (hopper.EXP_POLY_SWITCH, value) for value in ("1", "2")] + [
    (hopper.HOIST_STATS_SWITCH, value) for value in ("0", "1")] + [
    (hopper.DEFER_DK_SWITCH, value) for value in ("0", "1")]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
@pytest.mark.parametrize("switch, value", FUSED_SWITCH_SETTINGS,
                         ids=[f"{switch.removeprefix('FLASHTILE_GLUON_')}={value}"
                              for switch, value in FUSED_SWITCH_SETTINGS])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_fused_backward_under_each_switch_setting_matches_the_oracle(fused_backward_calls, monkeypatch, head_dim,
                                                                         switch, value):
    # Causal and not, rows past the end (lse2 = +inf), GQA 6:2, q longer and shorter than k,
    # fp16 (the finer rounding of Pᵀ) too, against the float64 oracle.
    monkeypatch.setenv(switch, value)
    check_case(2, 700, 777, 6, 2, head_dim, torch.bfloat16)
    check_case(1, 900, 333, 6, 2, head_dim, torch.bfloat16, causal=True, layout="bhsd")
    check_case(1, 203, 203, 2, 1, head_dim, torch.float16, causal=True)
    assert len(fused_backward_calls) == 3


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
@pytest.mark.parametrize("skip_end_meeting, dynamic", [("0", "0"), ("1", "0"), ("0", "1")],
                         ids=["end-meeting", "no-end-meeting", "dynamic"])
@pytest.mark.parametrize("programs", [None, 3], ids=["a-program-an-sm", "three-programs"])
@pytest.mark.parametrize("head_dim", [64, 128, 96])
def test_gpu_fused_backward_on_persistent_programs_matches_the_oracle(fused_backward_calls, monkeypatch, head_dim,
                                                                      programs, skip_end_meeting, dynamic):
    # Persistent programs (attempt 76) take key tile after key tile, the ring, the dS buffers'
    # meetings and kv_ready's phase carried on, the next tile's K and V loaded once this one's are
    # released: on one program an SM (the last case has 288 key tiles, 2-3 a program on the H200)
    # and on three programs, each then running up to 96 tiles of unequal length (causal; with q
    # shorter than k the last key tile sees 2 of 3 Q tiles: bottom-right, every key tile has a
    # query that sees it). GQA, both layouts, rows past the end, fp16 and bf16, head dim 96 on
    # the 128-wide kernel, against the float64 oracle. With and without the warpgroups' meeting
    # after each key tile (attempt 78; the d64 kernel skips it where asked, the d128 one never),
    # and with the key tiles taken from a counter the grid shares (attempt 79).
    monkeypatch.setenv(hopper.FUSED_PERSISTENT_SWITCH, "1")
    monkeypatch.setenv(hopper.SKIP_END_MEETING_SWITCH, skip_end_meeting)
    monkeypatch.setenv(hopper.FUSED_DYNAMIC_SWITCH, dynamic)
    monkeypatch.setattr(hopper, "FUSED_PERSISTENT_PROGRAMS", programs)
    launches = []
    launch = hopper.fast_launch.launch
    monkeypatch.setattr(hopper.fast_launch, "launch", lambda kernel, grid, *args, **kw: (
        launches.append((grid, kw.get("PERSISTENT", False), kw.get("SKIP_END_MEETING", False),
                         args[23] if kw.get("PERSISTENT") else None)), launch(kernel, grid, *args, **kw))[1])
    check_case(2, 700, 777, 6, 2, head_dim, torch.bfloat16)
    check_case(1, 900, 333, 6, 2, head_dim, torch.bfloat16, causal=True, layout="bhsd")
    check_case(1, 203, 203, 2, 1, head_dim, torch.float16, causal=True)
    check_case(2, 300, 1100, 4, 4, head_dim, torch.bfloat16, causal=True)
    check_case(4, 1000, 1100, 24, 8, head_dim, torch.bfloat16, layout="bhsd")
    assert len(fused_backward_calls) == 5
    persistent = [grid for grid, on, _, _ in launches if on]
    assert len(persistent) == 5, launches
    assert all(skip == (skip_end_meeting == "1") for _, on, skip, _ in launches if on)
    # the counter: an int32 of its own where the scheduler is dynamic; None in fixed turns
    assert all((counter is not None) == (dynamic == "1") for _, on, _, counter in launches if on)
    if programs is not None:  # (the third case has two key tiles: two programs)
        assert persistent == [(3,), (3,), (2,), (3,), (3,)], persistent


def test_the_persistent_switch_names_what_it_takes_and_auto_follows_the_table(monkeypatch):
    monkeypatch.setenv(hopper.FUSED_PERSISTENT_SWITCH, "often")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_BWD_PERSISTENT: expected one of auto, 1, 0, got 'often'"):
        hopper.fused_persistent(64, False, 1024)
    monkeypatch.setenv(hopper.FUSED_PERSISTENT_SWITCH, "1")
    assert hopper.fused_persistent(64, False, 16384) and hopper.fused_persistent(128, True, 1024)
    monkeypatch.setenv(hopper.FUSED_PERSISTENT_SWITCH, "0")
    assert not hopper.fused_persistent(64, True, 1024) and not hopper.fused_persistent(128, False, 1024)
    monkeypatch.delenv(hopper.FUSED_PERSISTENT_SWITCH)
    cases = [(d, causal) for d in (64, 128) for causal in (False, True)]
    # as timed (sessions 31-33): at up to 1k rows a key tile, causal d128 (on the dynamic scheduler) at
    # any length; no d256 kernel
    assert all(hopper.fused_persistent(*case, 1024) for case in cases)
    assert [hopper.fused_persistent(*case, 1025) for case in cases] == [False, False, False, True]
    assert hopper.fused_persistent(128, True, 1 << 20) and not hopper.fused_persistent(256, False, 1024)
    assert hopper.fused_dynamic(True) and not hopper.fused_dynamic(False)  # causal calls (session 33)
    monkeypatch.setattr(hopper, "FUSED_PERSISTENT_MAX_ROWS", {(64, False): 2048})  # the table decides
    assert hopper.fused_persistent(64, False, 2048) and not hopper.fused_persistent(64, False, 2049)
    assert not hopper.fused_persistent(64, True, 1024)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_a_dynamic_persistent_backward_takes_a_zeroed_counter_of_its_own(monkeypatch):
    # Attempt 79 (kernels stubbed): the dynamic scheduler's counter is one int32 of its own, zeroed
    # for the launch, as the forward's; the dQ sum and its conversion are as in fixed turns. Under
    # auto for causal calls (FUSED_DYNAMIC, session 33); fixed turns pass None.
    launches = _stubbed_fused_backward(monkeypatch)
    monkeypatch.setenv(hopper.FUSED_PERSISTENT_SWITCH, "1")
    monkeypatch.setattr(hopper, "sm_count", lambda device: 5)
    q, dout, dq, out = (torch.randn(2, 6, 300, 128, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.randn(2, 2, 333, 128, dtype=torch.bfloat16) for _ in range(4))
    for dynamic, causal in (("auto", False), ("auto", True), ("0", True), ("1", False), ("1", True)):
        monkeypatch.setenv(hopper.FUSED_DYNAMIC_SWITCH, dynamic)
        launches.clear()
        hopper.backward(q, k, v, out, dout, torch.randn(2, 6, 300), None, 0.125, causal, dq, dk, dv)
        (_, grid, args, const), (_, _, args_convert, _) = launches
        counter, dq_sum = args[23], args[8].base
        assert grid == (5,) and const["PERSISTENT"]
        assert dq_sum.shape == (2 * 6 * 384, 128) and args_convert[0] is dq_sum
        if dynamic == "0" or (dynamic == "auto" and not causal):  # auto: causal calls take the counter
            assert counter is None
        else:
            assert counter.dtype == torch.int32 and counter.shape == (1,) and int(counter) == 0
            assert counter.untyped_storage().data_ptr() != dq_sum.untyped_storage().data_ptr()
            # zeroed for each launch: the next call's counter starts at 0 whatever this one's reached
            counter.add_(5)  # (what the stubbed launch's loaders would have taken)
            launches.clear()
            hopper.backward(q, k, v, out, dout, torch.randn(2, 6, 300), None, 0.125, causal, dq, dk, dv)
            again = launches[0][2][23]
            assert again is not counter and int(again) == 0 and int(counter) == 5


def test_the_end_meeting_switch_names_what_it_takes_and_auto_keeps_the_meeting(monkeypatch):
    monkeypatch.setenv(hopper.SKIP_END_MEETING_SWITCH, "sometimes")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_BWD_SKIP_END_MEETING: expected one of auto, 1, 0"):
        hopper.fused_skip_end_meeting()
    monkeypatch.setenv(hopper.SKIP_END_MEETING_SWITCH, "1")
    assert hopper.fused_skip_end_meeting()
    monkeypatch.setenv(hopper.SKIP_END_MEETING_SWITCH, "0")
    assert not hopper.fused_skip_end_meeting()
    monkeypatch.delenv(hopper.SKIP_END_MEETING_SWITCH)
    assert hopper.fused_skip_end_meeting() is hopper.FUSED_SKIP_END_MEETING is False  # no gain (session 32)


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_auto_counts_the_rows_a_key_tile_streams_for_persistent_programs(monkeypatch):
    # The rows a key tile streams are its kv head's query heads × Sq: 1000 rows under MHA run
    # persistent programs at d64, 1000 rows in groups of 4 query heads (4000 a key tile, as many
    # steps as 4k MHA rows, where persistence gained nothing) do not (kernels stubbed).
    launches = _stubbed_fused_backward(monkeypatch)
    monkeypatch.delenv(hopper.FUSED_PERSISTENT_SWITCH, raising=False)
    monkeypatch.setattr(hopper, "sm_count", lambda device: 132)
    for heads_kv, expected in ((8, True), (2, None)):
        q, dout, dq, out = (torch.randn(1, 8, 1000, 64, dtype=torch.bfloat16) for _ in range(4))
        k, v, dk, dv = (torch.randn(1, heads_kv, 1000, 64, dtype=torch.bfloat16) for _ in range(4))
        launches.clear()
        hopper.backward(q, k, v, out, dout, torch.randn(1, 8, 1000), None, 0.125, False, dq, dk, dv)
        assert launches[0][3].get("PERSISTENT") is expected, heads_kv


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_a_persistent_fused_backward_launches_a_program_an_sm_and_never_with_the_tail_split(monkeypatch):
    # The host side (kernels stubbed): 2 batches × 2 kv heads × 16 key tiles = 64 key tiles on a
    # pretend 5 SMs run as 5 programs with PERSISTENT, on 64 or 200 SMs as 64; a launch without it
    # passes no PERSISTENT (its arguments and fast_launch key as before there was a choice); and
    # where the tail split is asked for too and splits (12 key tiles of 333 keys on 5 SMs, as in
    # the split's own test), the split wins and the launch is a program per key tile or part.
    launches = _stubbed_fused_backward(monkeypatch)
    batch, heads_q, heads_kv, seqlen_q = 2, 6, 2, 2048
    q, dout, dq, out = (torch.randn(batch, heads_q, seqlen_q, 128, dtype=torch.bfloat16) for _ in range(4))

    def kernel_launch(sms, persistent, tail="0", seqlen_k=2048):
        k, v, dk, dv = (torch.randn(batch, heads_kv, seqlen_k, 128, dtype=torch.bfloat16) for _ in range(4))
        monkeypatch.setattr(hopper, "sm_count", lambda device: sms)
        monkeypatch.setenv(hopper.FUSED_PERSISTENT_SWITCH, persistent)
        monkeypatch.setenv(hopper.TAIL_SWITCH, tail)
        launches.clear()
        hopper.backward(q, k, v, out, dout, torch.randn(batch, heads_q, seqlen_q), None, 0.125, False, dq, dk, dv)
        _, grid, _, const = launches[0]
        return grid, const.get("PERSISTENT"), const["TAIL_SPLIT"]

    assert kernel_launch(5, "1") == ((5,), True, False)
    assert kernel_launch(64, "1") == ((64,), True, False)
    assert kernel_launch(200, "1") == ((64,), True, False)
    assert kernel_launch(5, "0") == ((64,), None, False)
    assert kernel_launch(5, "1", tail="0", seqlen_k=333) == ((5,), True, False)
    assert kernel_launch(5, "1", tail="1", seqlen_k=333) == ((10 + 2 * 2,), None, True)


def test_the_defer_dk_switch_names_what_it_takes_and_auto_follows_the_table(monkeypatch):
    monkeypatch.setenv(hopper.DEFER_DK_SWITCH, "later")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_BWD_DEFER_DK: expected one of auto, 1, 0, got 'later'"):
        hopper.fused_defer_dk(64, False)
    monkeypatch.setenv(hopper.DEFER_DK_SWITCH, "1")
    assert hopper.fused_defer_dk(64, False) and hopper.fused_defer_dk(128, False)
    monkeypatch.setenv(hopper.DEFER_DK_SWITCH, "0")
    assert not hopper.fused_defer_dk(64, True) and not hopper.fused_defer_dk(128, True)
    monkeypatch.delenv(hopper.DEFER_DK_SWITCH)
    cases = [(d, causal) for d in (64, 128) for causal in (False, True)]
    assert [hopper.fused_defer_dk(*case) for case in cases] == [hopper.FUSED_DEFER_DK[case] for case in cases]
    # as timed (session 26): on at d64, and at d128 for causal calls only
    assert [hopper.fused_defer_dk(*case) for case in cases] == [True, True, False, True]


def test_the_hoist_switch_names_what_it_takes_and_auto_follows_the_table(monkeypatch):
    monkeypatch.setenv(hopper.HOIST_STATS_SWITCH, "2")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_BWD_HOIST_STATS: expected one of auto, 1, 0, got '2'"):
        hopper.fused_hoist_stats(128, False)
    monkeypatch.setenv(hopper.HOIST_STATS_SWITCH, "off")  # the words the other on/off switches take
    assert not hopper.fused_hoist_stats(128, True)
    monkeypatch.setenv(hopper.HOIST_STATS_SWITCH, "0")
    assert not hopper.fused_hoist_stats(128, False)
    monkeypatch.setenv(hopper.HOIST_STATS_SWITCH, "1")
    assert hopper.fused_hoist_stats(64, False)
    monkeypatch.delenv(hopper.HOIST_STATS_SWITCH)
    cases = [(d, causal) for d in (64, 128) for causal in (False, True)]
    assert [hopper.fused_hoist_stats(*case) for case in cases] == [hopper.FUSED_HOIST_STATS[case] for case in cases]


def test_the_dq_swizzle_switch_names_what_it_takes(monkeypatch):
    monkeypatch.setenv(hopper.DQ_SWIZZLE_SWITCH, "16")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_DQ_SWIZZLE: expected auto, 0, 32, 64 or 128"):
        hopper.dq_sum_swizzle()
    monkeypatch.setenv(hopper.DQ_SWIZZLE_SWITCH, " 32 ")
    assert hopper.dq_sum_swizzle() == 32
    for unset in ("auto", ""):
        monkeypatch.setenv(hopper.DQ_SWIZZLE_SWITCH, unset)
        assert hopper.dq_sum_swizzle() == hopper.DQ_SUM_SWIZZLE
    monkeypatch.delenv(hopper.DQ_SWIZZLE_SWITCH)
    assert hopper.dq_sum_swizzle() == hopper.DQ_SUM_SWIZZLE


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
def test_gpu_a_deterministic_call_keeps_to_the_seven_product_kernels(fused_backward_calls, monkeypatch):
    # deterministic=True (flashtile.attention and flash_attn_func alike) must give the same bits
    # on every call even where the fused backward is forced on; without it the fused one runs.
    q = torch.randn(2, 1500, 6, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 1700, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dout = torch.randn(2, 1500, 6, 128, device="cuda", dtype=torch.bfloat16)
    seven = _count_calls(monkeypatch, "_seven_product_backward")
    for face in (flashtile.attention, flashtile.flash_attn_func):
        out = face(q, k, v, causal=True, deterministic=True)
        first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for _ in range(5):
            again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            for name, a, b in zip(("dq", "dk", "dv"), first, again):
                assert torch.equal(a, b), name
    assert fused_backward_calls == [] and len(seven) == 12  # 2 faces × 6 calls, all Gluon
    out = flashtile.attention(q, k, v, causal=True)
    torch.autograd.grad(out, (q, k, v), dout)
    assert fused_backward_calls == [(2, 6, 1500, 128)]


@pytest.mark.skipif(hopper._gluon() is None, reason="this Triton has no Gluon Hopper descriptors")
def test_flashtile_info_says_whether_the_fused_backward_can_run(monkeypatch):
    # availability() on an sm_90 GPU (faked): its reason names the five-product backward's switch
    # where this Triton has TMA reductions, and the PTX rewrite that stands in where it has not.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(hopper, "_unsupported", lambda index: None)
    for has_reduce, words in ((True, "FLASHTILE_GLUON_BWD_FUSED"), (False, "rewritten in the PTX")):
        monkeypatch.setattr(hopper._gluon_common(), "HAS_TMA_REDUCE", has_reduce)
        available, why = hopper.availability()
        assert available and words in why, why


@pytest.mark.gpu
@pytest.mark.timeout(300)
@NEEDS_FUSED
def test_gpu_fused_backward_replays_from_a_cuda_graph(fused_backward_calls):
    # The fused backward allocates and zeroes its float32 dQ sum on every call; captured in a CUDA
    # graph and replayed on new inputs, its gradients must still meet the oracle's tolerance (not
    # bit for bit: the sum's order is free).
    q, k, v, dout = (torch.randn(1, 777, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        out = flashtile.attention(*leaves)
        return torch.autograd.grad(out, leaves, dout)

    graph, captured = _captured(step)
    for buffer in (*leaves, dout):
        buffer.detach().copy_(torch.randn_like(buffer))
    graph.replay()
    torch.cuda.synchronize()
    assert fused_backward_calls, "the step did not take the fused backward"
    exact = [t.detach().double().requires_grad_() for t in leaves]
    plain = [t.detach().clone().requires_grad_() for t in leaves]
    expected = torch.autograd.grad(flashtile.naive_attention(*exact, upcast=True), exact, dout.double())
    baseline = torch.autograd.grad(flashtile.naive_attention(*plain, upcast=False), plain, dout)
    for name, got, e, p in zip(("dq", "dk", "dv"), captured, expected, baseline):
        assert_close_to_oracle(name, got, e, p, grad=True)
