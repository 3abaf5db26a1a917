"""`pip install .` gives a pure-Python wheel: no compile step, the kernels shipped as source."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    setuptools = pytest.importorskip("setuptools", reason="building without isolation needs setuptools in the env")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build needs >= 77 (pyproject.toml)")
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the installed setuptools builds it, nothing is downloaded.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True)
    (built,) = out.glob("flashtile-*.whl")
    return built


def test_wheel_is_pure_python(wheel):
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dll", ".cubin"))], "compiled files in the wheel"
    for module in ("flashtile/api.py", "flashtile/kernels/fwd.py", "flashtile/kernels/bwd.py",
                   "flashtile/reference/tiled.py", "flashtile/score_mods.py", "flashtile/cli.py"):
        assert module in names, f"{module} missing from the wheel"


def test_wheel_metadata(wheel):
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names), "LICENSE missing from the wheel"
    meta = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in meta
    for extra in ("test", "bench", "hf"):
        assert f"Provides-Extra: {extra}" in meta
    entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "flashtile = " in entry_points, "the flashtile command is not declared"
