"""kernels/tma_reduce_ptx.py: the five-product backward's TMA reduction before Triton 3.8, a TMA
store rewritten in the PTX. The hook and the check on the CPU; tools/compile_check.py builds the
rewritten kernel for sm_90 (tests/test_compile_check.py), and the GPU suite runs it where the
installed Triton lacks the reduction (tests/test_gluon.py's fused tests)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")
from flashtile.kernels import hopper, tma_reduce_ptx  # noqa: E402  (imports Triton)

# A stand-in for the fused kernel's PTX: its dQ store (2-D), dK's store (4-D) and a 2-D load.
PTX = """
	@%p32 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r814, %r815}], [%r816];
	cp.async.bulk.commit_group;
	@%p24 cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%rd3, {%r498, %r499, %r500, %r501}], [%r502];
	@%p4 cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes [%r48], [%rd5, {%r1, %r2}], [%r47];
"""


@pytest.fixture
def hooks(monkeypatch):
    """Triton's stages hook as none installed it, restored afterwards."""
    monkeypatch.setattr(triton.knobs.runtime, "add_stages_inspection_hook", None)
    monkeypatch.setattr(tma_reduce_ptx, "_installed", None)
    return triton.knobs.runtime


def stages_after(hook, name: str) -> str:
    """The PTX that the stages ``hook`` leaves for a kernel called ``name``."""
    stages = {"ptx": lambda src, metadata: PTX, "cubin": lambda src, metadata: b""}
    hook(None, stages, None, None, 90)
    return stages["ptx"]("llir", {"name": name})


def test_only_the_2d_store_becomes_an_add_reduction():
    text = tma_reduce_ptx.rewrite(PTX)
    lines = [line.strip() for line in text.strip().splitlines()]
    assert lines[0] == ("@%p32 cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group "
                        "[%rd1, {%r814, %r815}], [%r816];")
    assert [a.strip() for a in PTX.strip().splitlines()[1:]] == lines[1:]  # commit, dK's 4-D store, the load


def test_the_hook_rewrites_the_named_kernels_only_and_runs_the_hook_before_it(hooks):
    seen = []
    hooks.add_stages_inspection_hook = lambda *args: seen.append(args[4])
    tma_reduce_ptx.install()
    hook = hooks.add_stages_inspection_hook
    assert stages_after(hook, "_dkdv_dq_kernel") == tma_reduce_ptx.rewrite(PTX)
    assert stages_after(hook, "_dq_kernel") == PTX
    assert seen == [90, 90]  # the hook installed before keeps running, first
    tma_reduce_ptx.install()  # once: a second install does not wrap it again
    assert hooks.add_stages_inspection_hook is hook


def test_the_hook_adds_its_part_to_a_cache_key(hooks):
    # Triton 3.8+ calls the hook without arguments for a part of the binaries' cache key.
    tma_reduce_ptx.install()
    key, digest = hooks.add_stages_inspection_hook()
    assert "tma-reduce-ptx" in key and len(digest) == 64
    hooks.add_stages_inspection_hook = lambda *args: ("other", "0" * 64) if not args else None
    tma_reduce_ptx.install()
    chained, chained_digest = hooks.add_stages_inspection_hook()
    assert chained.startswith("other") and "tma-reduce-ptx" in chained and chained_digest != digest


def test_the_check_passes_a_rewritten_binary_and_stops_one_that_stores():
    tma_reduce_ptx.check(SimpleNamespace(asm={"ptx": tma_reduce_ptx.rewrite(PTX)}))
    for ptx in (PTX, PTX.replace(tma_reduce_ptx.STORE, "")):  # stored, or neither
        with pytest.raises(tma_reduce_ptx.ReductionRewriteError, match="stores dQ where it should add"):
            tma_reduce_ptx.check(SimpleNamespace(asm={"ptx": ptx}))
    # a build error to hopper: under auto the seven-product kernels take over
    assert hopper._is_build_error(tma_reduce_ptx.ReductionRewriteError("x"))
