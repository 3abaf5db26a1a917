"""The GPU benchmark scripts, run on the CPU at tiny sizes: every code path runs before GPU time
is spent on them (the numbers printed here mean nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

SMOKE_RUNS = {
    "decode": (["decode.py", "--device", "cpu", "--batches", "2", "--cache", "512", "--heads", "16", "--no-flex"],
               ["copy ceiling:", "   2    512   16:8"]),
    "launch_overhead": (["launch_overhead.py", "--device", "cpu", "--seqlen", "64", "--batch", "2", "--varlen", "2",
                         "32", "--decode-batches", "2", "--cache", "256"],
                        ["dense N=64 causal=False grad=False", "dense N=64 causal=True grad=True",
                         "varlen 2x32 causal grad=True", "decode B=2 cache=256"]),
    # --top 40: every op of the call listed, so the op's own row is there however a loaded CPU
    # ranks its self time against the aten ops' (with the default 6 it dropped out under load)
    "kernel_times": (["kernel_times.py", "--device", "cpu", "--seqs", "2", "--seqlen", "64", "--iters", "2",
                      "--top", "40"],
                     ["backward, 2 x 64 causal", "== dense", "== varlen", "flashtile::attention_backward"]),
    "masks": (["masks.py", "--device", "cpu", "--seqlen", "256", "--docs", "2", "--no-flex"],
              ["built-in causal", "mask_mod causal", "document mask (2 docs)"]),
    "mask_tiles_schedule": (["mask_tiles.py", "schedule", "--device", "cpu", "--headdims", "16", "--seqlens", "256"],
                            ["d=16 N=256 built-in causal", "128x64 bwd_n=64 longest-first",
                             "128x128 bwd_n=128 identity"]),
    "mask_tiles_configs": (["mask_tiles.py", "configs", "--device", "cpu", "--headdims", "16", "--seqlens", "256"],
                           ["128x64 bwd_n=32 table", "128x128 bwd_n=128 dkdv w8s2 dq w8s2"]),
    "variants": (["variants.py", "--device", "cpu", "--seqlen", "256", "--window", "32", "--varlen", "2", "64"],
                 ["varlen vs dense (2 x 64, causal)", "dense causal", "sliding window 32 (causal)",
                  "causal + dropout 0.1", "causal + key bias"]),
}


@pytest.mark.parametrize("name", list(SMOKE_RUNS))
def test_benchmark_script_runs_on_the_cpu(name):
    args, expected_lines = SMOKE_RUNS[name]
    done = subprocess.run([sys.executable, *args], cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FLASHTILE_BACKEND": "reference"})
    assert done.returncode == 0, done.stderr[-3000:]
    for line in expected_lines:
        assert line in done.stdout, f"{name}: {line!r} missing from\n{done.stdout}"



def test_speed_table_plot_draws_the_committed_table(tmp_path):
    # The README's performance plot comes from this script and a committed speed table.
    pytest.importorskip("matplotlib")
    out = tmp_path / "speed.png"
    done = subprocess.run([sys.executable, "plot_speed_table.py", "results/2026-11-29-h200-issue3.json",
                           "--out", str(out), "--title", "test"], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_speed_table_plot_reads_a_bench_json(tmp_path):
    # The README's plot of session 9 is drawn from `flashtile bench --json`; its dense bf16 cells
    # become speed_table.py's rows, one per (head dim, mask, N) with each provider's fwd and bwd.
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from plot_speed_table import table_from_bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    data = json.loads((BENCHMARKS / "results/2026-11-30-h200-session9/bench.json").read_text())
    table = table_from_bench(data)
    assert len(table["rows"]) == 18  # d64/128/256 × causal or not × 1k/4k/16k
    row = next(r for r in table["rows"] if (r["headdim"], r["causal"], r["seqlen"]) == (128, False, 16384))
    cell = next(c for c in data["results"] if (c["headdim"], c["causal"], c["seqlen"], c["provider"], c["mode"])
                == (128, False, 16384, "sdpa-cudnn", "bwd"))
    assert row["sdpa-cudnn"]["bwd"] == cell["tflops"] and set(row["flashtile"]) == {"fwd", "bwd"}
