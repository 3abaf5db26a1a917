"""Compile the Gluon Hopper backward kernels (gluon_bwd.py) for sm_90a on the CPU and report resources.

    /tmp/venv211/bin/python benchmarks/probes/gluon_bwd/compile_bwd.py     # triton 3.6
    /work/venv/bin/python   benchmarks/probes/gluon_bwd/compile_bwd.py     # triton 3.9
    ... --dump DIR    # also write ttgir / ptx / sass of every variant

Per variant: REG / STACK from cuobjdump -res-usage (flashtile's tools/compile_check.py
resource_usage helper), ptxas -v's spill bytes (Triton's own ptxas rerun on the PTX), STL/LDL
and HGMMA counts in the SASS, setmaxnreg values in the PTX, shared memory from the metadata.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "..", "src")]
from flashtile.kernels.gluon_bwd import _dkdv_kernel, _dq_kernel  # noqa: E402

try:  # the project's helper (cuobjdump -res-usage), as the forward harness reports
    sys.path[:0] = [os.path.join(HERE, "..", "..", "..", "tools")]
    from compile_check import cuobjdump, resource_usage  # noqa: E402
except Exception:  # noqa: BLE001 - same thing, standalone
    def cuobjdump(compiled, flag, check=True):
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=check).stdout

    def resource_usage(compiled):
        report = cuobjdump(compiled, "-res-usage", check=False)
        regs, stack = re.search(r"REG:(\d+)", report), re.search(r"STACK:(\d+)", report)
        return f"regs={regs.group(1) if regs else '?'} stack={stack.group(1) if stack else '?'}"


def _desc(dtype, box):
    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    return f"tensordesc<{dtype}{box},{gl.NVMMASharedLayout.get_default_for(box, element)!r}>".replace(" ", "")


def _stats_desc(block_m):
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return f"tensordesc<fp32[1,{block_m}],{layout!r}>".replace(" ", "")


def compile_kernel(which, HEAD_DIM=128, BLOCK_M=None, BLOCK_N=None, NUM_STAGES=2, CAUSAL=False, DTYPE="bf16",
                   LOADER_REGS=24, CONSUMER_REGS=240, ONES=()):
    """ONES: integer arguments a launch passes as 1, which Triton then specialises to constexprs
    (group_size and heads_kv of MHA with one head, a 1-row query, ...)."""
    kernel = _dkdv_kernel if which == "dkdv" else _dq_kernel
    if which == "dkdv":
        BLOCK_M, BLOCK_N = BLOCK_M or 64, BLOCK_N or 128
        q_rows, kv_rows = BLOCK_M, BLOCK_N // 2
    else:
        BLOCK_M, BLOCK_N = BLOCK_M or 128, BLOCK_N or 64
        q_rows, kv_rows = BLOCK_M // 2, BLOCK_N
    constexprs = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, NUM_STAGES=NUM_STAGES, CAUSAL=CAUSAL,
                      LOADER_REGS=LOADER_REGS, CONSUMER_REGS=CONSUMER_REGS, num_warps=4, **{p: 1 for p in ONES})
    qd, kd = _desc(DTYPE, [1, 1, q_rows, HEAD_DIM]), _desc(DTYPE, [1, 1, kv_rows, HEAD_DIM])
    typed = {"q_desc": qd, "do_desc": qd, "dq_desc": qd, "k_desc": kd, "v_desc": kd, "dk_desc": kd, "dv_desc": kd,
             "lse_desc": _stats_desc(BLOCK_M), "delta_desc": _stats_desc(BLOCK_M), "LSE2": "*fp32",
             "Delta": "*fp32", "qk_scale": "fp32", "softmax_scale": "fp32"}
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: "constexpr" if p in constexprs else typed.get(p, "i32") for p in params}
    divisible = [p for p in ("LSE2", "Delta", "stride_lrow") if p in params]  # S_pad: a multiple of 128
    src = GluonASTSource(fn=kernel, signature=signature,
                         constexprs={(params.index(k), ): v for k, v in constexprs.items()},
                         attrs={(params.index(p), ): [["tt.divisibility", 16]] for p in divisible})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def ptxas_spills(compiled):
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(compiled.asm["ptx"])
        r = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", p, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    return f"spill={m.group(1)}/{m.group(2)}B" if m else "spill=?"


def report(compiled):
    sass = cuobjdump(compiled, "-sass")
    ptx = compiled.asm["ptx"]
    maxnreg = sorted({int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)})
    stl, ldl, hgmma = (len(re.findall(pattern, sass)) for pattern in (r"\bSTL\b", r"\bLDL\b", r"\bHGMMA\b"))
    smem = compiled.metadata.shared
    # REG is the launch cap (.maxnreg, 168 for 9 warps); the consumer warpgroups raise theirs
    # to 240 with setmaxnreg. The highest register the SASS names shows how close they get.
    top = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1)
    return (f"{resource_usage(compiled)} maxR=R{top} {ptxas_spills(compiled)} STL={stl} LDL={ldl} setmaxnreg={maxnreg} "
            f"HGMMA={hgmma} smem={smem}B ({smem / 1024:.1f} KiB)")


# Every variant check_bwd.py launches (hopper_bwd._config and the timing's alternatives), plus fp16.
VARIANTS = [
    *(("dkdv", dict(HEAD_DIM=d, NUM_STAGES=st, CAUSAL=c)) for d, st in ((128, 2), (128, 3), (64, 3))
      for c in (False, True)),
    ("dkdv", dict(HEAD_DIM=128, NUM_STAGES=2, CAUSAL=True, DTYPE="fp16")),
    *(("dq", dict(HEAD_DIM=d, BLOCK_N=bn, NUM_STAGES=st, CAUSAL=c)) for d, bn, st in ((128, 64, 3), (128, 128, 2),
                                                                                      (64, 64, 3), (64, 128, 2))
      for c in (False, True)),
    ("dq", dict(HEAD_DIM=128, BLOCK_N=64, NUM_STAGES=3, CAUSAL=True, DTYPE="fp16")),
    ("dkdv", dict(HEAD_DIM=128, NUM_STAGES=2, CAUSAL=True,
                  ONES=("group_size", "heads_kv", "seqlen_q", "num_n_blocks"))),
    ("dq", dict(HEAD_DIM=128, BLOCK_N=64, NUM_STAGES=3, CAUSAL=True, ONES=("group_size", "heads_q", "seqlen_q",
                                                                         "num_m_blocks"))),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir/ptx/sass of each bf16 variant into this directory")
    args = ap.parse_args(argv)
    print(f"triton {triton.__version__}")
    fails = 0
    for which, kw in VARIANTS:
        name = f"{which:4s} " + " ".join(f"{k}={v}" if k != "ONES" else "ones=" + ",".join(v) for k, v in kw.items())
        t = time.perf_counter()
        try:
            c = compile_kernel(which, **kw)
        except Exception as e:  # noqa: BLE001
            fails += 1
            while e.__cause__ is not None:  # the innermost compile error says what failed
                e = e.__cause__
            msg = str(e).strip().splitlines()
            print(f"FAIL {name}: {type(e).__name__}: {' | '.join(msg[-8:])[:2000]}", flush=True)
            continue
        print(f"ok   {name:52s} {time.perf_counter() - t:4.1f}s {report(c)}", flush=True)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            if kw.get("ONES") or kw.get("DTYPE"):
                continue
            tag = f"{triton.__version__}_{which}_" + "_".join(f"{k}{v}" for k, v in kw.items())
            for k in ("ttgir", "ptx"):
                with open(os.path.join(args.dump, f"{tag}.{k}"), "w") as f:
                    f.write(c.asm[k])
            with open(os.path.join(args.dump, f"{tag}.sass"), "w") as f:
                f.write(cuobjdump(c, "-sass"))
    print(f"{fails} failed" if fails else "all variants compile for sm_90a")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
