"""The kernels compile for Hopper (sm_90) with Triton's own compiler, on any machine.

The rest of the CPU suite runs the kernels in Triton's interpreter, which executes
their Python and never meets the compiler's rules (constexpr globals, static-branch
types, supported ops). This runs tools/compile_check.py --quick in a fresh process
without TRITON_INTERPRET, so a kernel that would not compile on a GPU fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_tool(script: str, *args: str, env: dict | None = None) -> str:
    """Run tools/<script> compiling for sm_90 (no TRITON_INTERPRET), with ``env`` added to the
    environment; its stdout, after it succeeded."""
    pytest.importorskip("triton")
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, **(env or {})}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # silences a Triton 3.9 notice; the default either way
    result = subprocess.run([sys.executable, str(ROOT / "tools" / script), *args],
                            capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_every_kernel_compiles_for_sm90():
    assert "all kernels compile for sm_90" in run_tool("compile_check.py", "--quick")


def test_the_in_turn_forward_keeps_q_apart_under_the_older_ptxas():
    # Triton 3.9 compiles sm_90 with CUDA 13.4's ptxas, which keeps Q's registers apart from P's by
    # itself; the 12.9 ptxas it also ships gives P Q's registers where they have one shape, as 12.8's
    # (Triton 3.6's, the GPU image's) did in session 28. Built with that one, the four-consumer
    # forward (64-key tiles) passes compile_check's SASS check only through gluon_fwd._consumer's guard.
    triton = pytest.importorskip("triton")
    older = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not (older.exists() and older.with_name("ptxas-blackwell").exists()):
        pytest.skip("this Triton compiles sm_90 with the one ptxas compile_check already runs")
    out = run_tool("compile_check.py", "--quick", "--only", "in turn", env={"TRITON_PTXAS_BLACKWELL_PATH": str(older)})
    assert "gluon fwd4" in out and "all kernels compile for sm_90" in out


def test_the_forward_stamps_its_timeline_only_when_traced():
    # gluon_fwd's Trace (probes/fwd_timeline.py) reads the SM's clock at each of the consumers' steps;
    # a launch without it (every call but the probe's) must build the kernel without a clock read.
    pytest.importorskip("triton")
    code = """
import compile_check
names = ["gluon fwd3 d=64 full bf16 s2 in turn persistent traced", "gluon fwd3 d=64 full fp16 s2 in turn persistent q2",
         "gluon fwd3 d=64 full fp16 s2 in turn persistent q2 dynamic"]
variants = {v[0]: v for v in compile_check.gluon_variants(False) if v[0] in names}
for name in names:
    _, kernel, constexprs, warps = variants[name]
    sass = compile_check.cuobjdump(compile_check.compile_gluon_variant(kernel, constexprs, warps), "-sass")
    print(name, "clock reads", sass.count("SR_CLOCKLO"))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tools")]), TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                            cwd=ROOT)
    if "no Gluon Hopper support" in result.stdout:
        pytest.skip("this Triton has no Gluon Hopper support")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    counts = dict(re.findall(r"^(.*) clock reads (\d+)$", result.stdout, re.MULTILINE))
    # each consumer (three) reads it 10 times in its code: before and after its Q wait, 4 a tile, 4 in the
    # epilogue (more should ptxas ever duplicate a block)
    assert int(counts["gluon fwd3 d=64 full bf16 s2 in turn persistent traced"]) >= 3 * 10, result.stdout
    assert int(counts["gluon fwd3 d=64 full fp16 s2 in turn persistent q2"]) == 0, result.stdout
    assert int(counts["gluon fwd3 d=64 full fp16 s2 in turn persistent q2 dynamic"]) == 0, result.stdout


def test_config_resources_reports_registers_and_spills():
    out = run_tool("config_resources.py", "--kernel", "dq", "--headdim", "64", "--blocks", "64", "--warps", "4",
                   "--stages", "2")
    assert re.search(r"64 x 64\s+w4 s2\s+regs=\d+ stack=\d+\s+smem=\d+ KiB", out), out


def test_shared_memory_estimates_cover_tritons_figures():
    # The config fit (kernels/configs.py) trims pipeline stages by an estimate of shared
    # memory; an estimate below Triton's own figure lets a config through that then fails
    # to launch on the GPU (the dropout keep mask did this at d128 once: 245760 bytes asked,
    # 232448 allowed on the H200). Triton's figures come from compiling for sm_90 here.
    assert "every shared-memory estimate covers Triton's" in run_tool("compile_check.py", "--smem")


@pytest.fixture(scope="module")
def pipeline_report() -> list[str]:
    """tools/pipeline_waits.py's lines: each kernel loop's waits on its copies in flight."""
    return run_tool("pipeline_waits.py").splitlines()


LOOP_FAMILIES = {"built-in": ["fwd built-in causal", "dq built-in causal", "dkdv built-in causal",
                              "decode paged=False"],
                 "block mask": ["fwd mask_mod causal", "dq mask_mod causal", "dkdv mask_mod causal",
                                "fwd mask_mod runs", "dq mask_mod runs", "dkdv mask_mod runs"],
                 "paged": ["decode paged=True"]}


def draining(report: list[str], family: str) -> list[str]:
    return [line for line in report if line.endswith("DRAINS") and any(line.startswith(name + " ")
                                                                         for name in LOOP_FAMILIES[family])]


def test_pipeline_report_has_every_kernels_loops(pipeline_report):
    for names in LOOP_FAMILIES.values():
        for name in names:
            assert any(line.startswith(name + " ") for line in pipeline_report), f"no loop of {name!r}"


def test_builtin_and_contiguous_loops_keep_copies_in_flight(pipeline_report):
    # At 3 stages the loop waits until two groups of copies remain (0x2; dK/dV's 0x4): the
    # next tiles load under this one's math. A wait for none (0x0) drains the pipeline.
    assert draining(pipeline_report, "built-in") == []


def test_block_mask_loops_keep_copies_in_flight(pipeline_report):
    # Their full tiles walked as one range, or run by run (each run a range; the loop over
    # runs waits for all copies once per run); walked through the list, the loop drained.
    assert draining(pipeline_report, "block mask") == []


def test_paged_decode_loop_keeps_copies_in_flight(pipeline_report):
    # One block-table lookup per page, outside the tile loop; per tile, the loop drained.
    assert draining(pipeline_report, "paged") == []


def test_sass_compare_finds_a_tree_equal_to_itself_and_reports_a_change(tmp_path):
    # The same tree dumped twice: every variant's SASS equal (exit 0). A dump edited by one
    # instruction: that variant differs (exit 1), so the tool can fail.
    only = "gluon dq d=128 causal fp16"
    if "skip gluon kernels" in run_tool("compile_check.py", "--only", "nothing-matches"):
        pytest.skip("this Triton has no Gluon Hopper support")
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        assert "lines" in run_tool("sass_compare.py", "dump", str(directory), "--only", only)
    (name,) = [path.name for path in first.iterdir()]
    assert "0 of 1 variants differ" in run_tool("sass_compare.py", "diff", str(first), str(second))
    sass = (second / name).read_text().splitlines()
    index = next(i for i, line in enumerate(sass) if "MUFU.EX2" in line)
    sass[index] = sass[index].replace("MUFU.EX2", "MUFU.LG2")
    (second / name).write_text("\n".join(sass))
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sass_compare.py"), "diff", str(first), str(second)],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1 and "1 of 1 variants differ" in result.stdout, result.stdout


def _sass_operands():
    """tools/sass_operands.py as a module (tools/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("flashtile_tools_sass_operands", ROOT / "tools" / "sass_operands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A loop of an in-turn forward tile, as cuobjdump prints it: Q loaded once before the loop, S = Q Kᵀ
# (B plain), P packed, O += P V (B transposed), back to the loop's top. Session 28's miscompile put P
# in Q's registers (the first loop); a correct build keeps Q apart and moves it back (the second).
_LOOP = """
        /*0000*/                   LDSM.16.M88.4 R{q}, [R8] ;
        /*0010*/                   {restore}
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR12], RZ, !UPT, gsb0 ;
        /*0030*/                   F2FP.BF16.F32.PACK_AB R88, R25, R24 ;
        /*0040*/                   F2FP.BF16.F32.PACK_AB R89, R27, R26 ;
        /*0050*/                   F2FP.BF16.F32.PACK_AB R90, R29, R28 ;
        /*0060*/                   F2FP.BF16.F32.PACK_AB R91, R31, R30 ;
        /*0070*/                   HGMMA.64x64x16.F32.BF16 R56, R88, gdesc[UR16].tnspB, R56, gsb0 ;
        /*0080*/               @P0 BRA 0x10 ;
        /*0090*/                   EXIT ;
"""


def test_the_sass_check_finds_p_read_as_q_and_passes_q_kept_apart():
    clashes = _sass_operands().clashes
    found = clashes(_LOOP.format(q=88, restore="NOP ;"))
    assert len(found) == 1 and found[0].startswith("0070 HGMMA") and "0020 HGMMA" in found[0], found
    # a move of one of the four registers back is not enough: the other three still hold P
    assert len(clashes(_LOOP.format(q=88, restore="IMAD.MOV.U32 R88, RZ, RZ, R4 ;"))) == 1
    moves = "".join(f"        /*001{2 * i}*/   MOV R{89 + i - 1}, R{5 + i - 1} ;\n" for i in (1, 2, 3))
    kept = _LOOP.format(q=4, restore="IMAD.MOV.U32 R88, RZ, RZ, R4 ;").replace("        /*0020*/",
                                                                             moves + "        /*0020*/")
    assert clashes(kept) == []
    # Q read by S alone (P in other registers), as the shipped 128-key kernels keep them
    apart = _LOOP.format(q=88, restore="NOP ;")
    for register, other in (("R88", "R40"), ("R89", "R41"), ("R90", "R42"), ("R91", "R43")):
        apart = apart.replace(f"PACK_AB {register},", f"PACK_AB {other},")
    assert clashes(apart.replace("R56, R88, gdesc[UR16]", "R56, R40, gdesc[UR16]")) == []
    # without the loop's branch back, P V is the last reader: nothing to flag
    assert clashes(_LOOP.format(q=88, restore="NOP ;").replace("@P0 BRA 0x10", "NOP")) == []
    # nvdisasm's listing (tools/sass_compare.py's dumps) names branch targets by label
    labelled = _LOOP.format(q=88, restore="NOP ;").replace("        /*0010*/", ".L_x_1:\n        /*0010*/")
    assert len(clashes(labelled.replace("BRA 0x10", "BRA `(.L_x_1)"))) == 1
    with pytest.raises(ValueError, match="not an instruction of this listing"):
        clashes(labelled.replace("BRA 0x10", "BRA `(.L_x_9)"))
