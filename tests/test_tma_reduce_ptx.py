"""kernels/tma_reduce_ptx.py: the five-product backward's TMA reduction before Triton 3.8, a TMA
store rewritten in the PTX. The hook and the check on the CPU; tools/compile_check.py builds the
rewritten kernel for sm_90 (tests/test_compile_check.py), and the GPU suite runs it where the
installed Triton lacks the reduction (tests/test_gluon.py's fused tests)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")
from flashtile.kernels import hopper, tma_reduce_ptx  # noqa: E402  (imports Triton)

# A stand-in for the fused kernel's PTX: its two dQ stores (2-D, one per consumer warpgroup),
# dK's store (4-D) and a 2-D load.
PTX = """
	@%p32 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r814, %r815}], [%r816];
	cp.async.bulk.commit_group;
	@%p19 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r288, %r289}], [%r290];
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
    """The PTX that the stages ``hook`` leaves for a kernel whose entry is ``name`` (which Triton's
    make_ptx records in the metadata as it makes the PTX, as this stand-in does)."""
    def make_ptx(src, metadata):
        metadata["name"] = name
        return PTX

    stages = {"ptx": make_ptx, "cubin": lambda src, metadata: b""}
    hook(None, stages, None, None, 90)
    return stages["ptx"]("llir", {})


def test_only_the_2d_stores_become_add_reductions():
    text = tma_reduce_ptx.rewrite(PTX)
    before, after = ([line.strip() for line in t.strip().splitlines()] for t in (PTX, text))
    assert after[0] == ("@%p32 cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group "
                        "[%rd1, {%r814, %r815}], [%r816];")
    assert after[2] == before[2].replace(tma_reduce_ptx.STORE, tma_reduce_ptx.REDUCE) != before[2]
    assert after[1] == before[1] and after[3:] == before[3:]  # the commit, dK's 4-D store, the load
    assert tma_reduce_ptx.rewrite(text) == text


def test_the_hook_rewrites_the_named_kernels_only_and_runs_the_hook_before_it(hooks):
    seen = []
    hooks.add_stages_inspection_hook = lambda *args: seen.append(args[4])
    tma_reduce_ptx.install()
    hook = hooks.add_stages_inspection_hook
    assert stages_after(hook, tma_reduce_ptx.REWRITTEN) == tma_reduce_ptx.rewrite(PTX)
    assert stages_after(hook, "_dkdv_dq_kernel") == PTX  # the native build's name: left alone
    assert stages_after(hook, "_dq_kernel") == PTX
    assert seen == [90, 90, 90]  # the hook installed before keeps running, first
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


def test_the_check_passes_a_rewritten_binary_and_stops_any_other():
    tma_reduce_ptx.check(SimpleNamespace(asm={"ptx": tma_reduce_ptx.rewrite(PTX)}))
    # a box copied in parts (the 32-byte swizzle at d128): two reductions a warpgroup
    in_parts = PTX.replace("cp.async.bulk.commit_group;", tma_reduce_ptx.STORE + " [%rd1, {%r1, %r2}], [%r3];")
    tma_reduce_ptx.check(SimpleNamespace(asm={"ptx": tma_reduce_ptx.rewrite(in_parts)}))
    one_left = tma_reduce_ptx.rewrite(PTX).replace(tma_reduce_ptx.REDUCE, tma_reduce_ptx.STORE, 1)
    one_only = tma_reduce_ptx.rewrite(PTX.replace(tma_reduce_ptx.STORE, "nop", 1))
    for ptx in (PTX, PTX.replace(tma_reduce_ptx.STORE, ""), one_left, one_only):  # stored, neither, one
        # store left beside a reduction, one warpgroup's reduction alone
        with pytest.raises(tma_reduce_ptx.ReductionRewriteError, match="built without flashtile's PTX rewrite"):
            tma_reduce_ptx.check(SimpleNamespace(asm={"ptx": ptx}))
    # a build error to hopper: under auto the seven-product kernels take over
    assert hopper._is_build_error(tma_reduce_ptx.ReductionRewriteError("x"))


def test_without_its_ptx_the_check_reads_the_sass():
    # (TRITON_STORE_BINARY_ONLY=1: Triton keeps no PTX of a binary, and asm's "sass" is disassembled)
    sass = "UTMAREDG.2D.ADD [UR8], [UR4] ;\nUTMAREDG.2D.ADD [UR8], [UR6] ;\nUTMASTG.4D [UR4], [UR12] ;"
    tma_reduce_ptx.check(SimpleNamespace(asm={"ptx": None, "sass": sass}))
    with pytest.raises(tma_reduce_ptx.ReductionRewriteError):
        tma_reduce_ptx.check(SimpleNamespace(asm={"sass": sass.replace("UTMAREDG.2D.ADD", "UTMASTG.2D")}))
