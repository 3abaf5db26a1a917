"""The ``flashtile`` command: demo, info, bench, and its argument errors.

The demo runs on tiny problems here; its default problem is exercised by running
``flashtile demo`` itself (the README's first command).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from flashtile import backend_status, cli
from flashtile.api import attention

TINY = ["demo", "--device", "cpu", "--seqlen", "48", "--heads", "2", "--headdim", "16"]


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """Run ``flashtile ARGS`` in-process on a wide console; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps at 80 columns when not on a terminal

    def run(*args: str):
        code = cli.main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def _line_with(text: str, *words: str) -> str:
    lines = [line for line in text.splitlines() if all(w in line for w in words)]
    assert lines, f"no line with {words} in:\n{text}"
    return lines[0]


def test_info_shows_versions_and_every_backend_with_its_reason(run_cli):
    code, out, _ = run_cli("info")
    assert code == 0
    assert torch.__version__ in out
    for status in backend_status():
        row = _line_with(out, status.name, status.reason)
        assert ("yes" if status.available else "no") in row
    assert "FLASHTILE_BACKEND" in out and "TRITON_INTERPRET" in out


def test_info_shows_the_environment(run_cli, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code, out, _ = run_cli("info")
    assert code == 0
    assert "reference" in _line_with(out, "FLASHTILE_BACKEND")
    assert "1" in _line_with(out, "TRITON_INTERPRET").replace("TRITON_INTERPRET", "")
    assert "reference" in _line_with(out, "CPU tensors run on")


def test_info_shows_the_gluon_switches(run_cli, monkeypatch):
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.setenv("FLASHTILE_GLUON_BWD", "1")
    code, out, _ = run_cli("info")
    assert code == 0
    # The switches' own rows (on an sm_90 GPU the Gluon availability line names them too).
    assert _row(out, "FLASHTILE_GLUON")[1].startswith("unset (auto")
    assert _row(out, "FLASHTILE_GLUON_BWD")[1] == "1"


def _row(out: str, name: str) -> list[str]:
    """The stripped cells of the table row whose first cell is ``name``."""
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in:\n{out}")


def test_demo_reports_agreement_time_memory_and_the_long_context(run_cli, monkeypatch):
    monkeypatch.delenv("FLASHTILE_BACKEND", raising=False)
    code, out, _ = run_cli(*TINY, "--long-seqlen", "1024")
    assert code == 0, out
    assert "backend: reference" in out
    for tensor in ("out", "dq", "dk", "dv"):
        assert "pass" in _line_with(out, "│ " + tensor + " ")
    assert "agreement: pass" in out
    for name in ("flashtile", "standard attention"):  # a time and a memory for each
        assert re.search(r"│ +[\d.]+ m?s │ +[\d.]+ (B|KiB|MiB) │", _line_with(out, name, "fwd+bwd"))
    # The long context: flashtile measured, standard attention computed, never run.
    assert re.search(r"│ +[\d.]+ (B|KiB|MiB) │", _line_with(out, "flashtile", "1024", "fwd"))
    standard_bytes = 2 * 1 * 2 * 1024 * 1024 * 4  # S and P, float32
    assert cli.format_bytes(standard_bytes) in _line_with(out, "standard attention", "1024", "not run")


def test_demo_without_long_context(run_cli, monkeypatch):
    monkeypatch.delenv("FLASHTILE_BACKEND", raising=False)
    code, out, _ = run_cli(*TINY, "--long-seqlen", "0", "--no-causal", "--dtype", "float16")
    assert code == 0, out
    assert "not run" not in out and "· full ·" in out and "float16" in out


def test_demo_fails_when_flashtile_disagrees_with_the_oracle(run_cli, monkeypatch):
    monkeypatch.delenv("FLASHTILE_BACKEND", raising=False)
    # Off by 0.1%: far above float32 rounding, so the contract must catch it.
    monkeypatch.setattr(cli, "attention", lambda *args, **kwargs: attention(*args, **kwargs) * 1.001)
    code, out, _ = run_cli(*TINY, "--long-seqlen", "0")
    assert code == 1
    assert "FAIL" in _line_with(out, "│ out ")
    assert "agreement: FAIL" in out


def test_demo_rejects_an_unknown_backend(run_cli, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", "fastest")
    code, out, _ = run_cli(*TINY, "--long-seqlen", "0")
    assert code == 2
    assert "FLASHTILE_BACKEND" in out


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--seqlen", "0"],
        ["demo", "--heads", "two"],
        ["demo", "--headdim", "-8"],
        ["demo", "--long-seqlen", "-1"],
        ["demo", "--dtype", "float64"],
        ["demo", "--device", "tpu"],
        ["demo", "--verbose"],
        ["train"],
        [],
    ],
    ids=lambda args: " ".join(args) or "no-command",
)
def test_bad_arguments_are_argparse_errors(run_cli, args):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(*args)
    assert exit_info.value.code == 2


def test_bad_argument_message_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--seqlen", "0"])
    err = capsys.readouterr().err
    assert "--seqlen" in err and "expected an integer >= 1, got 0" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_demo_on_cuda_without_a_gpu_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_python_dash_m_runs_the_same_command():
    env = {k: v for k, v in os.environ.items() if k != "FLASHTILE_BACKEND"} | {"COLUMNS": "250"}
    result = subprocess.run(
        [sys.executable, "-m", "flashtile", *TINY, "--long-seqlen", "0"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "agreement: pass" in result.stdout



def test_info_says_whether_the_hopper_kernels_can_run_here(run_cli):
    code, out, _ = run_cli("info")
    assert code == 0
    cells = [cell.strip() for cell in _line_with(out, "Hopper kernels (Gluon)").split("│")]
    if not torch.cuda.is_available():
        assert cells[2:4] == ["no", "no CUDA GPU"], cells
    elif torch.cuda.get_device_capability() == (9, 0) and torch.version.hip is None:
        assert cells[2] == "yes", cells
    else:
        assert cells[2] == "no" and "9.0" in cells[3], cells
