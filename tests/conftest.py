"""Suite-wide setup: Triton's interpreter on CPU-only machines, markers, seeding.

``import torch`` does not import Triton, so torch can tell us whether a GPU is
visible before anything imports Triton; Triton reads ``TRITON_INTERPRET`` when
its kernels are decorated (flashtile loads them on first use), so setting it here
is early enough.
"""

import os
import sys
import zlib

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
assert "triton" not in sys.modules or HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1", (
    "triton was imported before tests/conftest.py could set TRITON_INTERPRET=1"
)
if HAS_CUDA and os.environ.get("TRITON_INTERPRET", "0") == "0":
    # On a GPU machine the kernels are decorated here, compiled: Triton decides at decoration
    # whether a kernel runs compiled or interpreted. A test that sets TRITON_INTERPRET=1 for a
    # moment (test_cli's info, errors_table's CPU rows) and happened to be the first to import
    # them left every later test of its xdist worker running the interpreter on CUDA tensors
    # (session 18: 36 of tests-c's failures, InterpreterErrors on CUDA tensors).
    from flashtile.kernels import append, decode_launch, hopper, launch  # noqa: E402, F401

    hopper._gluon()  # the Gluon modules, where this Triton has them

import pytest  # noqa: E402

from flashtile import call_cache  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    # Under pytest-xdist on a machine with several GPUs, spread the workers over them:
    # tests say device="cuda", which is the current device of each worker process.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if HAS_CUDA and worker.startswith("gw") and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow: pass --runslow to run it")
    skip_gpu = pytest.mark.skip(reason="gpu: needs a CUDA GPU (torch.cuda.is_available() is False here)")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
    if HAS_CUDA:
        # The longest first, so that xdist's load scheduling (one test per worker, in
        # order) starts them at once: the Hypothesis GPU shards (250-430 s, compiling),
        # then the other gpu tests; started last, two shards outran the GPU call's limit.
        def rank(item):
            name = getattr(item, "originalname", "")
            return 0 if name == "test_gpu_kernels_match_oracle" else 1 if "gpu" in item.keywords else 2
        items.sort(key=rank)  # stable: file order within each rank


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """Seed torch from the test's node id: fresh inputs per test, same inputs per rerun."""
    value = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(value)
    return value


@pytest.fixture(autouse=True)
def forget_checked_calls():
    """Each test starts with no remembered checks (flashtile.call_cache): a test that spies on
    what a call's checks decide, or patches what they read, sees them run on its first call."""
    call_cache.clear()
    hopper = sys.modules.get("flashtile.kernels.hopper")
    if hopper is not None:  # its launch plans: keyed by every setting they read, cleared all the same
        hopper._DENSE_FORWARD_PLANS.clear()


@pytest.fixture
def reference_backend(monkeypatch):
    """Pin the PyTorch reference backend, whatever the caller's environment says."""
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
