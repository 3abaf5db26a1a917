"""``flashtile bench``: the quick grid on the CPU, its JSON, the FLOP count, failures
recorded rather than raised, the plots, and the providers computing the same attention.

The timings themselves are not checked (the CPU numbers of a smoke run mean little);
what is checked is that every cell is either a number or a reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from flashtile import cli, naive_attention
from flashtile.bench import PROVIDERS, SCENARIOS, Case, Provider, flops, providers, report, targets
from flashtile.bench.harness import MODES, Grid, Measurement

GPU_ONLY = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex", "flash-attn")
TINY = ["bench", "--quick", "--device", "cpu", "--seqlens", "64", "--causal", "no", "--scenario", "dense"]
ROW_KEYS = {"scenario", "window", "documents", "dtype", "mode", "headdim", "causal", "seqlen", "batch", "heads",
            "provider", "status", "ms", "tflops", "first_call_ms", "flops", "reason", "rounds_ms"}


@pytest.fixture
def bench(monkeypatch, capsys, tmp_path):
    """Run ``flashtile bench ARGS --json tmp`` in-process: (exit code, stdout, the JSON or None)."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv("FLASHTILE_BACKEND", raising=False)
    path = tmp_path / "bench.json"

    def run(*args: str):
        code = cli.main([*args, "--json", str(path)])
        out = capsys.readouterr().out
        return code, out, json.loads(path.read_text()) if path.exists() else None

    return run


def _rows(doc, **where):
    return [r for r in doc["results"] if all(r[k] == v for k, v in where.items())]


def test_quick_runs_on_the_cpu_and_writes_the_json(bench):
    code, out, doc = bench("bench", "--quick", "--device", "cpu")
    assert code == 0, out
    assert doc["complete"] is True and doc["schema"] == 1
    meta = doc["meta"]
    for key in ("date", "device", "gpu", "torch", "triton", "dtype", "flashtile", "flashtile_backend", "timer"):
        assert key in meta
    assert meta["device"] == "cpu" and meta["gpu"] is None and meta["torch"] == torch.__version__
    assert meta["flashtile_backend"] == "reference" and meta["dtype"] == ["bf16"]
    assert set(doc["grid"]) >= {"scenarios", "dtypes", "headdims", "causal", "seqlens", "modes", "tokens", "hidden"}
    assert set(doc["providers"]) == set(PROVIDERS)

    grid = doc["grid"]
    cells = len(grid["scenarios"]) * len(grid["dtypes"]) * len(grid["headdims"]) * len(grid["causal"]) \
        * len(grid["seqlens"]) * len(grid["modes"])
    assert set(grid["modes"]) == set(MODES)
    for row in doc["results"]:
        assert set(row) == ROW_KEYS
        assert (row["status"] == "ok") == (row["ms"] is not None), row
        assert row["status"] == "ok" or row["reason"], row
    for name in ("flashtile", "naive"):  # every cell of every scenario
        rows = _rows(doc, provider=name)
        assert len(rows) == cells and all(r["status"] == "ok" and r["tflops"] > 0 for r in rows)
    for name in ("sdpa", "sdpa-math"):  # dense only
        assert all(r["status"] == "ok" for r in _rows(doc, provider=name, scenario="dense"))
        for scenario in ("sliding-window", "document"):
            assert all(r["status"] == "unsupported" for r in _rows(doc, provider=name, scenario=scenario))
    for name in GPU_ONLY:
        rows = _rows(doc, provider=name)
        assert len(rows) == cells and all(r["status"] == "unsupported" and "GPU" in r["reason"] for r in rows)

    first = [c for c in doc["first_call"] if c["provider"] == "flashtile"]
    assert {(c["scenario"], c["causal"], c["mode"]) for c in first} == {
        (s["name"], causal, mode) for s in grid["scenarios"] for causal in grid["causal"] for mode in ("fwd", "bwd")
    }
    assert all(c["first_call_ms"] > 0 and c["overhead_ms"] >= 0 for c in first)
    assert "dense · bf16 · fwd" in out and "First-call cost" in out and "Cells not measured" in out
    assert doc["targets"] == [] and "Targets" not in out  # no GPU provider ran: nothing to compare


def test_rounds_time_every_cell_again_with_the_providers_in_turn(bench, monkeypatch):
    # --rounds 3: each (case, provider) measured three times, round by round (the providers'
    # order repeats, so a drift of the machine falls on all of them); each cell reports the
    # median round and keeps every round's time; the first call is the first round's.
    from flashtile.bench import harness

    order = []
    measure = harness.measure
    monkeypatch.setattr(harness, "measure", lambda provider, case, *a: (order.append(provider.name),
                                                                        measure(provider, case, *a))[1])
    code, out, doc = bench(*TINY, "--providers", "flashtile", "naive", "--modes", "fwd", "--rounds", "3")
    assert code == 0, out
    assert order == ["flashtile", "naive"] * 3
    assert "the median of 3 rounds, providers in turn" in doc["meta"]["timer"]
    rows = _rows(doc, status="ok")
    assert {r["provider"] for r in rows} == {"flashtile", "naive"} and len(rows) == 2
    for row in rows:
        assert len(row["rounds_ms"]) == 3 and row["ms"] == sorted(row["rounds_ms"])[1]
    code, out, doc = bench(*TINY, "--providers", "flashtile", "--modes", "fwd")  # one round: no list
    assert code == 0 and _rows(doc, provider="flashtile")[0]["rounds_ms"] is None


def test_a_cell_that_fails_in_any_round_reports_the_failure():
    from flashtile.bench.harness import combine_rounds

    case = Case(SCENARIOS["dense"](), torch.float32, 16, False, 64, 1, 2)
    ok = [[Measurement("p", case, "fwd", "ok", ms, first_call_ms=5.0)] for ms in (3.0, 1.0, 2.0)]
    (cell,) = combine_rounds(ok)
    assert cell.ms == 2.0 and cell.rounds_ms == [3.0, 1.0, 2.0] and cell.first_call_ms == 5.0
    broken = Measurement("p", case, "fwd", "error", reason="RuntimeError: boom")
    assert combine_rounds([ok[0], [broken], ok[2]]) == [broken]
    assert combine_rounds(ok[:1]) == ok[0]


def test_with_rounds_a_ratio_is_the_median_of_the_rounds_own_ratios():
    # Times taken in the same round pair up: here the machine slowed in round 2 for both, and
    # the paired ratios (1.1, 0.9, 1.2) have the median 1.1 where the medians' ratio reads 1.2.
    from flashtile.bench.harness import speedup

    case = Case(SCENARIOS["dense"](), torch.bfloat16, 128, False, 16384, 1, 16)
    mine = Measurement("flashtile", case, "bwd", "ok", 1.5, rounds_ms=[1.0, 2.0, 1.5])
    theirs = Measurement("sdpa-cudnn", case, "bwd", "ok", 1.8, rounds_ms=[1.1, 1.8, 1.8])
    assert speedup(mine, theirs) == pytest.approx(1.1)
    single = Measurement("sdpa-cudnn", case, "bwd", "ok", 1.8)  # one round: the medians' ratio
    assert speedup(mine, single) == pytest.approx(1.2)
    (result,) = [r for r in targets.check([mine, theirs]) if r.target.provider == "sdpa-cudnn"]
    assert result.worst_ratio == pytest.approx(1.1) and result.met == 1


def test_rounds_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main([*TINY, "--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err


def test_flops_follow_the_convention_on_a_hand_case():
    # 4·B·H·N²·D = 4·2·3·8²·16
    assert flops(2, 3, 8, 16, causal=False) == 24576
    assert flops(2, 3, 8, 16, causal=True) == 12288
    assert flops(2, 3, 8, 16, causal=True, mode="bwd") == 30720
    assert flops(2, 3, 8, 16, causal=False, mode="fwd+bwd") == 24576 * 3.5
    dense = SCENARIOS["dense"]()
    case = Case(dense, torch.bfloat16, headdim=16, causal=True, seqlen=8, batch=2, heads=3)
    assert dense.flops(case, "bwd") == 30720


def test_documents_count_the_pairs_they_compute():
    docs = SCENARIOS["document"](documents=2)
    causal = Case(docs, torch.float32, headdim=1, causal=True, seqlen=5, batch=1, heads=1)
    full = Case(docs, torch.float32, headdim=1, causal=False, seqlen=5, batch=1, heads=1)
    assert docs.document_ids(5, "cpu").tolist() == [0, 0, 0, 1, 1]
    assert docs.pairs(full) == 3 * 3 + 2 * 2
    assert docs.pairs(causal) == (3 * 3 + 2 * 2) / 2  # the field's causal convention, per document
    with pytest.raises(ValueError, match="documents must be >= 1"):
        SCENARIOS["document"](documents=0)


def test_a_sliding_window_counts_the_pairs_it_computes():
    window = SCENARIOS["sliding-window"](window=1)
    causal = Case(window, torch.float32, headdim=1, causal=True, seqlen=4, batch=1, heads=1)
    full = Case(window, torch.float32, headdim=1, causal=False, seqlen=4, batch=1, heads=1)
    assert window.pairs(causal) == 1 + 2 + 2 + 2  # query i sees keys i-1 and i
    assert window.pairs(full) == 2 + 3 + 3 + 2  # keys i-1, i, i+1
    assert window.flops(full, "fwd") == 4 * 10


def _broken(fail_in: str, error: Exception):
    def build(case, q, k, v):
        if fail_in == "build":
            raise error

        def forward():
            out = (q * 1.0).contiguous()
            if fail_in == "backward":  # raises when autograd reaches it
                out = out + _Raise.apply(q)
            return out

        return forward

    return build


class _Raise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward kernel exploded\nsecond line")


def test_a_failing_provider_is_recorded_not_raised(bench, monkeypatch):
    monkeypatch.setitem(PROVIDERS, "broken", Provider("broken", "broken", _broken("build", RuntimeError("no kernel"))))
    monkeypatch.setitem(PROVIDERS, "oom", Provider("oom", "oom", _broken("build", torch.OutOfMemoryError("oom!"))))
    monkeypatch.setitem(PROVIDERS, "bwd-broken", Provider("bwd-broken", "bwd-broken",
                                                          _broken("backward", ValueError())))
    code, out, doc = bench(*TINY, "--providers", "flashtile", "broken", "oom", "bwd-broken", "--modes", *MODES)
    assert code == 0, out  # only flashtile's own failures fail the run
    assert all(r["status"] == "ok" for r in _rows(doc, provider="flashtile"))
    assert {(r["status"], r["reason"]) for r in _rows(doc, provider="broken")} == {
        ("error", "RuntimeError: no kernel")}
    assert {r["status"] for r in _rows(doc, provider="oom")} == {"oom"}
    bwd = {r["mode"]: r for r in _rows(doc, provider="bwd-broken")}
    assert bwd["fwd"]["status"] == "ok"
    for mode in ("bwd", "fwd+bwd"):
        assert bwd[mode]["status"] == "error"
        assert bwd[mode]["reason"] == "RuntimeError: backward kernel exploded"
    assert "no kernel" in out and "backward kernel exploded" in out


def test_flashtile_failing_fails_the_run(bench, monkeypatch):
    monkeypatch.setitem(PROVIDERS, "flashtile", Provider("flashtile", "flashtile", _broken("build", TypeError("x"))))
    code, out, doc = bench(*TINY, "--providers", "flashtile", "naive", "--modes", "fwd")
    assert code == 1
    assert "flashtile failed" in out
    assert doc["complete"] is True and _rows(doc, provider="naive")[0]["status"] == "ok"


def test_standard_attention_is_skipped_when_its_memory_would_not_fit(bench, monkeypatch):
    monkeypatch.setattr(providers, "free_bytes", lambda device: 2**20)  # 1 MiB free
    code, out, doc = bench(*TINY, "--providers", "flashtile", "naive", "sdpa-math", "--modes", "fwd")
    assert code == 0, out
    for name in ("naive", "sdpa-math"):
        (row,) = _rows(doc, provider=name)
        assert row["status"] == "unsupported" and "GiB" in row["reason"] and "free" in row["reason"]
    assert _rows(doc, provider="flashtile")[0]["status"] == "ok"


def test_plots_are_written_per_panel(bench, tmp_path):
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    code, out, _ = bench(*TINY, "--seqlens", "64", "128", "--causal", "both", "--modes", "fwd", "bwd",
                         "--providers", "flashtile", "naive", "--plot-dir", str(plots))
    assert code == 0, out
    names = sorted(p.name for p in plots.glob("*.png"))
    panels = [f"dense-bf16-{m}-d64-{c}.png" for m in ("bwd", "fwd") for c in ("causal", "full")]
    assert names == sorted(panels + ["dense-bf16-bwd.png", "dense-bf16-fwd.png"])
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_plot_dir_without_matplotlib_says_how_to_get_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(SystemExit) as exit_:
        cli.main([*TINY, "--plot-dir", "unused"])
    assert exit_.value.code == 2
    assert "pip install" in capsys.readouterr().err


def test_the_full_grid_on_a_cpu_is_refused_with_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--device", "cpu"])
    assert exit_.value.code == 2
    assert "--quick" in capsys.readouterr().err


def test_the_benchmarks_script_is_the_same_command():
    script = Path(__file__).parents[1] / "benchmarks" / "run_bench.py"
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--quick", "--headdims", "--seqlens", "--causal", "--modes", "--dtypes", "--providers",
                 "--scenario", "--json", "--plot-dir", "--device"):
        assert flag in result.stdout


# -- the adapters compute the same attention (masks aligned, layouts right)


def _agree(device: str, dtype: torch.dtype, names, bound: float):
    for scenario in (SCENARIOS["dense"](), SCENARIOS["sliding-window"](window=9), SCENARIOS["document"](documents=3)):
        for causal in (False, True):
            case = Case(scenario, dtype, headdim=64, causal=causal, seqlen=80, batch=2, heads=3)
            q, k, v = scenario.inputs(case, torch.device(device))
            band = scenario.window_size(causal)
            bias = None
            if scenario.documents is not None:  # the truth's own document mask, built here
                ids = torch.arange(80, device=device) * 3 // 80
                bias = torch.where(ids[:, None] == ids[None, :], 0.0, float("-inf")).double()
            truth = naive_attention(*(t.double() for t in (q, k, v)), causal=causal, window_size=band, bias=bias,
                                    upcast=True, layout="bhsd")
            for name in names:
                provider = PROVIDERS[name]
                try:
                    provider.check(case, q.device, backward=False)
                    out = provider.build(case, q, k, v)()
                except providers.Unsupported:
                    continue
                if out.shape != truth.shape:  # flash-attn answers in (B, S, H, D)
                    out = out.transpose(1, 2)
                err = (out.double() - truth).abs().max().item()
                assert err <= bound, f"{name} {scenario.name} causal={causal}: max error {err}"


def test_cpu_providers_compute_the_same_attention():
    _agree("cpu", torch.float32, [n for n in PROVIDERS if n not in GPU_ONLY], bound=1e-4)


@pytest.mark.gpu
def test_gpu_providers_compute_the_same_attention():
    # bf16: the bound catches a misaligned mask or a wrong layout (errors of order 0.1–1),
    # not precision.
    _agree("cuda", torch.bfloat16, list(PROVIDERS), bound=3e-2)


def _timed(provider, headdim, causal, seqlen, mode, ms, scenario="dense"):
    case = Case(SCENARIOS[scenario](), torch.bfloat16, headdim, causal, seqlen, batch=16384 // seqlen,
                heads=2048 // headdim)
    return Measurement(provider, case, mode, "ok", ms=ms)


def test_the_targets_are_checked_on_the_runs_own_cells():
    cells = [
        _timed("flashtile", 128, False, 16384, "fwd", 1.0), _timed("sdpa-cudnn", 128, False, 16384, "fwd", 0.94),
        _timed("flashtile", 128, True, 16384, "bwd", 2.0), _timed("sdpa-cudnn", 128, True, 16384, "bwd", 2.2),
        _timed("sdpa-cudnn", 128, False, 4096, "fwd", 9.0),  # no flashtile cell: not compared
        _timed("flashtile", 64, False, 1024, "fwd", 1.0), _timed("sdpa-flash", 64, False, 1024, "fwd", 1.7),
        _timed("flashtile", 128, False, 16384, "fwd", 1.0, scenario="document"),  # not a dense cell
        _timed("flex", 128, False, 16384, "fwd", 0.5, scenario="document"),
    ]
    cells.append(Measurement("flex", cells[0].case, "fwd", "error", reason="boom"))  # failed: not compared
    results = {r.target.provider: r for r in targets.check(cells)}
    assert set(results) == {"sdpa-cudnn", "sdpa-flash"}  # Flex has no dense time to compare
    cudnn = results["sdpa-cudnn"]
    assert (cudnn.cells, cudnn.met, cudnn.holds) == (2, 1, False)
    assert cudnn.worst_ratio == pytest.approx(0.94) and cudnn.worst_cell == "d128 full N=16384 fwd"
    fa2 = results["sdpa-flash"]
    assert (fa2.cells, fa2.met, fa2.holds) == (1, 1, True) and fa2.worst_ratio == pytest.approx(1.7)


def test_the_report_prints_and_writes_the_targets(capsys):
    cells = [_timed("flashtile", 128, False, 16384, "fwd", 1.0), _timed("sdpa-cudnn", 128, False, 16384, "fwd", 1.1)]
    console = Console(width=200, force_terminal=False)
    console.print(report.targets_table(cells))
    out = capsys.readouterr().out
    assert "d128, N = 16k: ≥ 1.0× SDPA cuDNN" in out and "×1.10 (d128 full N=16384 fwd)" in out and "yes" in out
    grid = Grid((SCENARIOS["dense"](),), (torch.bfloat16,), (128,), (False,), (16384,), ("fwd",))
    doc = report.to_json({}, grid, ["flashtile", "sdpa-cudnn"], cells, [], complete=True)
    assert doc["targets"] == [{"target": "d128, N = 16k: ≥ 1.0× SDPA cuDNN", "provider": "sdpa-cudnn", "ratio": 1.0,
                               "cells": 1, "met": 1, "worst_ratio": pytest.approx(1.1),
                               "worst_cell": "d128 full N=16384 fwd", "holds": True}]
    assert report.targets_table(cells[:1]) is None  # nothing to compare with


def test_environment_sets_its_names_for_the_block_and_puts_each_back(monkeypatch):
    from flashtile.bench.cli import fresh_compile_caches
    from flashtile.bench.environ import environment

    monkeypatch.setenv("FLASHTILE_TEST_SET", "before")
    monkeypatch.delenv("FLASHTILE_TEST_UNSET", raising=False)
    with environment({"FLASHTILE_TEST_SET": "inside", "FLASHTILE_TEST_UNSET": "inside"}):
        assert os.environ["FLASHTILE_TEST_SET"] == os.environ["FLASHTILE_TEST_UNSET"] == "inside"
        os.environ["FLASHTILE_TEST_OTHER"] = "set inside"  # not one of its names: kept
    assert os.environ["FLASHTILE_TEST_SET"] == "before" and "FLASHTILE_TEST_UNSET" not in os.environ
    assert os.environ.pop("FLASHTILE_TEST_OTHER") == "set inside"
    with environment({"FLASHTILE_TEST_SET": None}):  # None: unset for the block (errors table rows)
        assert "FLASHTILE_TEST_SET" not in os.environ
    assert os.environ["FLASHTILE_TEST_SET"] == "before"
    # the cold-cache switch of `flashtile bench`: three caches in one new directory, then as before
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/kept")
    monkeypatch.delenv("FLASHTILE_CACHE_DIR", raising=False)
    with fresh_compile_caches(True):
        root = os.path.dirname(os.environ["TRITON_CACHE_DIR"])
        assert os.path.isdir(root) and os.environ["FLASHTILE_CACHE_DIR"] == os.path.join(root, "flashtile")
    assert os.environ["TRITON_CACHE_DIR"] == "/tmp/kept" and "FLASHTILE_CACHE_DIR" not in os.environ
    assert not os.path.exists(root)
