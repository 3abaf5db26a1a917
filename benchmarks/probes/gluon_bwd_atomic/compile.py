"""Compile the five-product backward (atomic_dq.py) for sm_90 on the CPU; report registers,
spills, wgmma count, shared memory and the barriers each partition uses.

    PYTHONPATH=src:tools python benchmarks/probes/gluon_bwd_atomic/compile.py
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "gluon_bwd")]
from atomic_dq import _dkdv_dq_kernel  # noqa: E402
from compile_bwd import _desc, _stats_desc, report  # noqa: E402


def _dq_desc(block_m, half_d):
    """The float32 dQ sum's descriptor type under DQ_BY_TMA: (block_m, D / 2) boxes."""
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for([block_m, half_d], gl.float32)
    return f"tensordesc<fp32[{block_m},{half_d}],{layout!r}>".replace(" ", "")


def compile_variant(HEAD_DIM=128, NUM_STAGES=2, CAUSAL=False, DTYPE="bf16", DQ_BY_TMA=False):
    block_m, block_n = 64, 128
    constexprs = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=NUM_STAGES, CAUSAL=CAUSAL,
                      LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4, DQ_BY_TMA=DQ_BY_TMA)
    qd, kd = _desc(DTYPE, [1, 1, block_m, HEAD_DIM]), _desc(DTYPE, [1, 1, block_n // 2, HEAD_DIM])
    typed = {"q_desc": qd, "do_desc": qd, "k_desc": kd, "v_desc": kd, "dk_desc": kd, "dv_desc": kd,
             "lse_desc": _stats_desc(block_m), "delta_desc": _stats_desc(block_m),
             "DQacc": _dq_desc(block_m, HEAD_DIM // 2) if DQ_BY_TMA else "*fp32",
             "qk_scale": "fp32", "softmax_scale": "fp32"}
    params = list(inspect.signature(_dkdv_dq_kernel.fn).parameters)
    signature = {p: "constexpr" if p in constexprs else typed.get(p, "i32") for p in params}
    src = GluonASTSource(fn=_dkdv_dq_kernel, signature=signature,
                         constexprs={(params.index(k),): v for k, v in constexprs.items()},
                         attrs={**({} if DQ_BY_TMA else {(params.index("DQacc"),): [["tt.divisibility", 16]]}),
                                (params.index("s_pad"),): [["tt.divisibility", 16]]})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def main():
    print(f"triton {triton.__version__}")
    from triton.experimental.gluon.language.nvidia.hopper import tma

    by_tma = [False, True] if hasattr(tma, "async_atomic_add") else [False]  # Triton 3.8+
    for (d, stages, causal), dq_by_tma in itertools.product(
            ((128, 2, False), (128, 2, True), (64, 2, True), (64, 3, False)), by_tma):
        start = time.perf_counter()
        try:
            compiled = compile_variant(HEAD_DIM=d, NUM_STAGES=stages, CAUSAL=causal, DQ_BY_TMA=dq_by_tma)
        except Exception as err:  # noqa: BLE001
            while err.__cause__ is not None:
                err = err.__cause__
            print(f"d{d} s{stages} causal={causal} tma={dq_by_tma}: FAIL {str(err).strip()[-700:]}")
            continue
        ptx = compiled.asm["ptx"]
        barriers = sorted(set(re.findall(r"bar\.sync\s+[^;]*;|barrier\.sync[^;]*;", ptx)))
        reds = len(re.findall(r"red\.[^ ]*global[^ ]*", ptx))
        bulk_reduce = len(re.findall(r"cp\.reduce\.async\.bulk", ptx))
        print(f"d{d} s{stages} causal={causal} tma={dq_by_tma}: {report(compiled)} red={reds} "
              f"bulk_reduce={bulk_reduce} barriers={barriers} "
              f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
