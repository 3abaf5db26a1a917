"""Context parallelism (flashtile.distributed) against single-process attention through the oracle.

The distributed tests spawn real process groups with torch.multiprocessing: gloo on
CPU with the reference backend (world sizes 2 and 4), and NCCL on two GPUs when the
machine has them. Each rank gets its shard of one set of random inputs, runs ring or
Ulysses attention forward and backward, and the shards of out, LSE and the gradients
are gathered and rejoined. The parent compares them with the float64 oracle under the
numerical contract (baseline: standard attention in the input dtype).

Starting a process that imports torch costs seconds, and the first call of a custom op
imports torch._dynamo (seconds more). So the ranks start from a forkserver that has
imported both once (fresh processes, forked from a server that never ran a kernel or
touched a GPU), and one process group per world size runs every case; the test per
case then only compares. The planner and the sharding helpers are checked in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from dataclasses import asdict, dataclass
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashtile import naive_attention
from flashtile.masks import Band
from flashtile.testing import assert_close_to_oracle

from flashtile.distributed import (
    position_ids,
    ring_attention,
    shard,
    ulysses_attention,
    unshard,
    zigzag_position_ids,
    zigzag_shard,
    zigzag_unshard,
)
from flashtile.distributed.plan import plan_block
from flashtile.distributed.sharding import shard_segments

NAMES = ("out", "lse", "dq", "dk", "dv")


# ---------------------------------------------------------------------------
# Cases: one set of inputs each, run on every rank.


@dataclass(frozen=True)
class Case:
    name: str
    fn: str  # "ring" or "ulysses"
    sharding: str
    causal: bool = False
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    layout: str = "bshd"
    batch: int = 1
    seqlen: int = 64
    heads: tuple[int, int] = (2, 2)  # (heads_q, heads_kv)
    headdim: int = 16
    lse_grad: bool = False  # a gradient also flows into the LSE
    dtype: torch.dtype = torch.float32


def cpu_cases(world: int) -> list[Case]:
    uly_heads = (4, 2) if world <= 2 else (4, 4)  # Ulysses needs heads divisible by the world size
    return [
        Case("ring-zigzag-causal-gqa", "ring", "zigzag", causal=True, batch=2, heads=(4, 2), lse_grad=True),
        Case("ring-zigzag-full-softcap", "ring", "zigzag", softcap=2.0, layout="bhsd"),
        Case("ring-zigzag-window", "ring", "zigzag", window_size=(5, 3), heads=(2, 1)),
        Case("ring-zigzag-causal-window", "ring", "zigzag", causal=True, window_size=(11, -1), seqlen=48),
        Case("ring-contiguous-causal", "ring", "contiguous", causal=True, layout="bhsd", lse_grad=True),
        Case("ring-contiguous-full", "ring", "contiguous", batch=2, heads=(4, 4), seqlen=32),
        Case("ring-contiguous-window", "ring", "contiguous", causal=True, window_size=(9, -1), heads=(4, 1)),
        Case("ulysses-zigzag-causal", "ulysses", "zigzag", causal=True, heads=uly_heads, lse_grad=True),
        Case("ulysses-contiguous-full", "ulysses", "contiguous", heads=(4, 4), layout="bhsd"),
        Case("ulysses-contiguous-window-alibi", "ulysses", "contiguous", causal=True, window_size=(7, -1),
             alibi=True, heads=uly_heads),
    ]


def gpu_cases() -> list[Case]:
    big = dict(dtype=torch.bfloat16, seqlen=4096, heads=(8, 4), headdim=64)
    return [
        Case("gpu-ring-zigzag-causal", "ring", "zigzag", causal=True, lse_grad=True, **big),
        Case("gpu-ring-contiguous-full", "ring", "contiguous", **big),
        Case("gpu-ring-zigzag-window", "ring", "zigzag", causal=True, window_size=(1000, -1), **big),
        Case("gpu-ulysses-zigzag-causal", "ulysses", "zigzag", causal=True, **big),
    ]


def _seq_dim(layout: str) -> int:
    return 1 if layout == "bshd" else 2


def make_inputs(case: Case, generator: torch.Generator) -> dict:
    b, n, (hq, hkv), d = case.batch, case.seqlen, case.heads, case.headdim

    def randn(heads):
        shape = (b, n, heads, d) if case.layout == "bshd" else (b, heads, n, d)
        return torch.randn(shape, generator=generator).to(case.dtype)

    inputs = {"q": randn(hq), "k": randn(hkv), "v": randn(hkv), "dout": randn(hq)}
    inputs["dlse"] = torch.randn(b, hq, n, generator=generator) if case.lse_grad else None
    inputs["alibi"] = torch.rand(hq, generator=generator) * 0.5 + 0.05 if case.alibi else None
    return inputs


def attention_options(case: Case) -> dict:
    return dict(causal=case.causal, window_size=case.window_size, softcap=case.softcap, layout=case.layout)


# ---------------------------------------------------------------------------
# What each rank runs.


def _gather(t: torch.Tensor, dim: int, world: int, sharding: str) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return unshard(parts, dim, world, sharding).cpu()


def run_case(case: Case, inputs: dict, rank: int, world: int, device: torch.device) -> dict:
    """This rank's shard forward and backward; the full tensors gathered (on every rank)."""
    sd = _seq_dim(case.layout)
    q, k, v, dout = (shard(inputs[x].to(device), sd, world, rank, case.sharding).clone() for x in
                     ("q", "k", "v", "dout"))
    for t in (q, k, v):
        t.requires_grad_()
    extra = {"softcap": case.softcap}
    if case.fn == "ulysses":
        fn = ulysses_attention
        if inputs["alibi"] is not None:
            extra["alibi_slopes"] = inputs["alibi"].to(device)
    else:
        fn = ring_attention
    out, lse = fn(q, k, v, causal=case.causal, window_size=case.window_size, layout=case.layout,
                  sharding=case.sharding, return_lse=True, **extra)
    loss = (out.float() * dout.float()).sum()
    if inputs["dlse"] is not None:
        loss = loss + (lse * shard(inputs["dlse"].to(device), 2, world, rank, case.sharding)).sum()
    loss.backward()
    local = {"out": out.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return {name: _gather(t, 2 if name == "lse" else sd, world, case.sharding) for name, t in local.items()}


def _worker(rank: int, world: int, init_method: str, device_kind: str, cases_path: str, result_path: str) -> None:
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # must stay set on this workplace's machines
    if device_kind == "cpu":
        os.environ["FLASHTILE_BACKEND"] = "reference"
        torch.set_num_threads(1)  # world ranks share the CI machine's 2 cores
        device, backend = torch.device("cpu"), "gloo"
    else:
        os.environ["FLASHTILE_BACKEND"] = "triton"  # the kernels, whatever the server's environment said
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        payload = torch.load(cases_path, weights_only=False)
        results = {}
        for fields, inputs in payload:
            case = Case(**fields)
            results[case.name] = run_case(case, inputs, rank, world, device)
        if rank == 0:
            torch.save(results, result_path)
        dist.barrier()  # no rank tears down its connections while another still reads
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_cases(world: int, cases: list[Case], device_kind: str, tmp_dir, seed: int) -> tuple[dict, dict]:
    """Run every case on a fresh process group of ``world`` ranks; returns (inputs, results) by case name."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {c.name: make_inputs(c, generator) for c in cases}
    cases_path = os.path.join(tmp_dir, f"cases-{device_kind}-{world}.pt")
    result_path = os.path.join(tmp_dir, f"results-{device_kind}-{world}.pt")
    torch.save([(asdict(c), inputs[c.name]) for c in cases], cases_path)
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    # Takes effect when the forkserver starts (the first call); later calls reuse it.
    multiprocessing.set_forkserver_preload(["torch", "torch._dynamo", "flashtile", "flashtile.distributed"])
    mp.start_processes(_worker, args=(world, init_method, device_kind, cases_path, result_path), nprocs=world,
                       join=True, start_method="forkserver")
    return inputs, torch.load(result_path, weights_only=False)


# ---------------------------------------------------------------------------
# The comparison: single-process attention through the oracle.


def _naive(case: Case, inputs: dict, upcast: bool, device) -> tuple:
    leaves = [inputs[x].to(device).detach().clone() for x in ("q", "k", "v")]
    if upcast:
        leaves = [t.double() for t in leaves]
    for t in leaves:
        t.requires_grad_()
    alibi = None if inputs["alibi"] is None else inputs["alibi"].to(device)
    out, lse = naive_attention(*leaves, alibi_slopes=alibi, upcast=upcast, return_lse=True,
                               **attention_options(case))
    dtype = out.dtype
    loss = (out * inputs["dout"].to(device, dtype)).sum()
    if inputs["dlse"] is not None:
        loss = loss + (lse * inputs["dlse"].to(device, lse.dtype)).sum()
    loss.backward()
    return tuple(t.detach().cpu() for t in (out, lse, *(leaf.grad for leaf in leaves)))


def check_case(case: Case, inputs: dict, result: dict, device="cpu") -> None:
    truth = _naive(case, inputs, True, device)
    base = _naive(case, inputs, False, device)
    assert truth[0].abs().max() > 0, "the oracle's output is all zeros: the test would prove nothing"
    for i, name in enumerate(NAMES):
        got = result[name]
        assert got.shape == truth[i].shape, f"{case.name}: {name} shape {tuple(got.shape)} != {tuple(truth[i].shape)}"
        assert got.dtype == (torch.float32 if name == "lse" else case.dtype), f"{case.name}: {name} dtype {got.dtype}"
        assert not torch.isnan(got).any(), f"{case.name}: {name} has NaN"
        assert_close_to_oracle(f"{case.name}: {name}", got, truth[i], base[i], grad=i >= 2)


# ---------------------------------------------------------------------------
# gloo, CPU, reference backend.

WORLD_SIZES = (1, 2, 4)  # 1: the ring without a hop


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    """world size -> (inputs, results), each spawned once, on first use."""
    runs = {}

    def get(world: int):
        if world not in runs:
            tmp = tmp_path_factory.mktemp(f"gloo{world}")
            runs[world] = spawn_cases(world, cpu_cases(world), "cpu", str(tmp), seed=1000 + world)
        return runs[world]

    return get


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("index", range(len(cpu_cases(2))), ids=[c.name for c in cpu_cases(2)])
def test_gloo_matches_oracle(gloo_runs, world, index):
    case = cpu_cases(world)[index]
    inputs, results = gloo_runs(world)
    check_case(case, inputs[case.name], results[case.name])


# ---------------------------------------------------------------------------
# NCCL on two GPUs, Triton kernels.


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_two_gpus_match_oracle(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the ranks set it too: they fork from a server started earlier
    cases = gpu_cases()
    inputs, results = spawn_cases(2, cases, "cuda", str(tmp_path), seed=7)
    for case in cases:
        check_case(case, inputs[case.name], results[case.name], device="cuda")


# ---------------------------------------------------------------------------
# In-process: the block planner and the sharding helpers.


def _global_visible(q_pos, k_pos, band: Band) -> torch.Tensor:
    diff = k_pos[None, :] - q_pos[:, None]
    ok = torch.ones_like(diff, dtype=torch.bool)
    if band.left is not None:
        ok &= diff >= -band.left
    if band.right is not None:
        ok &= diff <= band.right
    return ok


def _covered(calls, lq: int, lk: int) -> torch.Tensor:
    """How many calls cover each (local query, block key) pair."""
    from flashtile.masks import band_mask

    count = torch.zeros(lq, lk, dtype=torch.int64)
    for c in calls:
        mask = band_mask(c.q_hi - c.q_lo, c.k_hi - c.k_lo, Band(c.window_left, c.window_right))
        count[c.q_lo:c.q_hi, c.k_lo:c.k_hi] += mask
    return count


@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_plan_covers_each_visible_pair_once(sharding, world):
    """Every (query, key) pair the global band allows is computed by exactly one call; no other is."""
    local_len = 12
    rng = torch.Generator().manual_seed(world)
    bands = [Band(None, None), Band(None, 0), Band(5, 0), Band(3, 2), Band(0, 0), Band(None, 7), Band(30, None)]
    bands += [Band(int(torch.randint(0, 40, (1,), generator=rng)), int(torch.randint(0, 40, (1,), generator=rng)))
              for _ in range(4)]
    for band in bands:
        for rank in range(world):
            mine = shard_segments(sharding, world, rank, local_len)
            q_pos = position_ids(world * local_len, world, rank, sharding)
            for src in range(world):
                theirs = shard_segments(sharding, world, src, local_len)
                k_pos = position_ids(world * local_len, world, src, sharding)
                calls = plan_block(mine, theirs, band)
                expected = _global_visible(q_pos, k_pos, band).long()
                got = _covered(calls, local_len, local_len)
                assert torch.equal(got, expected), (sharding, world, band, rank, src, calls)


def test_plan_zigzag_causal_is_one_balanced_call_per_step():
    world, local_len = 4, 16
    chunk = local_len // 2
    for step in range(world):
        work = set()
        for rank in range(world):
            src = (rank - step) % world
            calls = plan_block(shard_segments("zigzag", world, rank, local_len),
                               shard_segments("zigzag", world, src, local_len), Band(None, 0))
            assert len(calls) == 1, (rank, src, calls)
            (c,) = calls
            if src == rank:  # the own block: causal over the whole shard
                assert (c.q_lo, c.q_hi, c.k_lo, c.k_hi, c.window_left, c.window_right) == (0, 16, 0, 16, None, 0)
            elif src < rank:  # every query sees the early key chunk: unmasked
                assert (c.q_lo, c.q_hi, c.k_lo, c.k_hi, c.window_left, c.window_right) == (0, 16, 0, 8, None, None)
            else:  # only the late query chunk sees anything, and all of it
                assert (c.q_lo, c.q_hi, c.k_lo, c.k_hi, c.window_left, c.window_right) == (8, 16, 0, 16, None, None)
            work.add(int(_covered(calls, local_len, local_len).sum()))
        assert len(work) == 1, f"step {step}: unbalanced work {work}"
    assert chunk == 8


def test_plan_contiguous_causal_skips_future_blocks():
    mine = shard_segments("contiguous", 3, 1, 10)
    assert plan_block(mine, shard_segments("contiguous", 3, 2, 10), Band(None, 0)) == ()
    (c,) = plan_block(mine, shard_segments("contiguous", 3, 0, 10), Band(None, 0))
    assert (c.window_left, c.window_right) == (None, None)


def test_zigzag_shard_layout_and_roundtrip():
    x = torch.arange(16).reshape(1, 16, 1) * 1.0
    assert zigzag_shard(x, 1, 2, 0).flatten().tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert zigzag_shard(x, 1, 2, 1).flatten().tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert zigzag_position_ids(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    y = torch.randn(2, 3, 24, 5)
    for world in (1, 2, 3, 4):
        for sharding in ("zigzag", "contiguous"):
            if 24 % (world * (2 if sharding == "zigzag" else 1)):
                continue
            shards = [shard(y, 2, world, r, sharding) for r in range(world)]
            assert torch.equal(unshard(shards, 2, world, sharding), y)
            assert torch.equal(unshard(torch.cat(shards, 2), 2, world, sharding), y)
            for r in range(world):
                pos = position_ids(24, world, r, sharding)
                assert torch.equal(shards[r], y[:, :, pos])
    assert torch.equal(zigzag_unshard([zigzag_shard(y, 2, 3, r) for r in range(3)], 2, 3), y)


def test_sharding_errors_name_the_argument():
    with pytest.raises(ValueError, match="must divide by 8"):
        zigzag_shard(torch.zeros(1, 12), 1, 4, 0)
    with pytest.raises(ValueError, match="sharding"):
        shard(torch.zeros(1, 12), 1, 2, 0, "striped")
    with pytest.raises(ValueError, match="rank"):
        shard(torch.zeros(1, 12), 1, 2, 2)
    with pytest.raises(ValueError, match="even"):
        shard_segments("zigzag", 2, 0, 7)


def test_ring_attention_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(q, q, q)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ulysses_attention(q, q, q)
