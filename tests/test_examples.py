"""examples/train_gpt.py: a few real training steps on the embedded text, in-process.

Tiny models (one or two layers, context 32) keep each run to a second or two; the
script is the same one a user runs.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["--context", "32", "--batch-size", "8", "--n-layer", "2", "--n-embd", "32", "--n-head", "4",
        "--eval-batches", "1", "--quiet"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The tiled reference runs many small matmuls; on a busy 2-core machine two intra-op
    # threads wait on each other in every one of them (seconds per backward, measured),
    # while one thread takes milliseconds. Results are the same either way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def train_gpt():
    spec = importlib.util.spec_from_file_location("flashtile_example_train_gpt", EXAMPLES / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_embedded_text_is_shipped_with_its_provenance():
    text = (EXAMPLES / "data" / "shakespeare.txt").read_text(encoding="utf-8")
    assert 500_000 < len(text) < 1_000_000
    assert "Gutenberg" not in text  # the source package removed the Project Gutenberg notices
    notes = (EXAMPLES / "data" / "README.md").read_text(encoding="utf-8")
    assert "public domain" in notes and "shakespeare" in notes.lower()


def test_training_smoke(train_gpt, tmp_path):
    out = tmp_path / "run"
    code = train_gpt.main(["--steps", "40", "--lr", "1e-2", "--eval-interval", "20", "--sample-chars", "30",
                           "--out", str(out), *TINY])
    assert code == 0
    log = json.loads((out / "log.json").read_text())
    assert log["status"] == "ok" and len(log["steps"]) == 40
    losses = [s["loss"] for s in log["steps"]]
    # A fresh model predicts ~uniformly over 76 characters: loss ≈ ln 76 ≈ 4.33. Forty steps
    # learn at least the character frequencies (a unigram model of this text is ~3.3).
    assert losses[0] == pytest.approx(4.33, abs=0.1)
    assert log["final_loss"] < losses[0] - 0.8, losses
    assert [e["step"] for e in log["eval"]] == [20, 40] and log["eval"][1]["val_loss"] < losses[0] - 0.8
    assert log["tokens_per_s"] > 0 and log["peak_memory_bytes"] > 0
    assert len(log["sample"]) == 30
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert log["plot"] is None and "pip install matplotlib" in log["plot_error"]
    else:
        assert log["plot"] == "loss.png"
        assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_paths_agree(train_gpt, tmp_path):
    # Same seed: same weights, same batches. The three implementations differ only by
    # float32 rounding, so the losses agree to ~1e-6 at step 0 and stay within 1e-4
    # after two updates (which also compares their gradients). GQA (4 query heads,
    # 2 KV heads) exercises each path's head grouping.
    logs = {}
    for attn in ("flashtile", "sdpa", "naive"):
        out = tmp_path / attn
        assert train_gpt.main(["--attn", attn, "--steps", "3", "--n-kv-head", "2", "--sample-chars", "0",
                               "--out", str(out), *TINY]) == 0
        logs[attn] = json.loads((out / "log.json").read_text())
    flash = [s["loss"] for s in logs["flashtile"]["steps"]]
    for attn in ("sdpa", "naive"):
        other = [s["loss"] for s in logs[attn]["steps"]]
        assert other[0] == pytest.approx(flash[0], abs=1e-5), attn
        assert other == pytest.approx(flash, abs=1e-4), attn
    # naive attention holds (batch, heads, T, T) scores and probabilities: more memory.
    assert logs["naive"]["peak_memory_bytes"] > logs["flashtile"]["peak_memory_bytes"]


def test_compare_runs_tabulates(train_gpt, tmp_path, capsys):
    for attn in ("flashtile", "naive"):
        train_gpt.main(["--attn", attn, "--steps", "2", "--sample-chars", "0", "--out", str(tmp_path / attn), *TINY])
    spec = importlib.util.spec_from_file_location("flashtile_example_compare_runs", EXAMPLES / "compare_runs.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    assert compare.main([str(tmp_path / "flashtile"), str(tmp_path / "naive"), "--out",
                         str(tmp_path / "compare.png")]) == 0
    printed = capsys.readouterr().out
    assert "flashtile" in printed and "naive" in printed
