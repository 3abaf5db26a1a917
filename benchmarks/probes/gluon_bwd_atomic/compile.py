"""Compile the five-product backward (atomic_dq.py) for sm_90 on the CPU; report registers,
spills, wgmma count, shared memory and the barriers each partition uses.

    PYTHONPATH=src:tools python benchmarks/probes/gluon_bwd_atomic/compile.py
"""

from __future__ import annotations

import inspect
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


def compile_variant(HEAD_DIM=128, NUM_STAGES=2, CAUSAL=False, DTYPE="bf16"):
    block_m, block_n = 64, 128
    constexprs = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=NUM_STAGES, CAUSAL=CAUSAL,
                      LOADER_REGS=24, CONSUMER_REGS=240, num_warps=4)
    qd, kd = _desc(DTYPE, [1, 1, block_m, HEAD_DIM]), _desc(DTYPE, [1, 1, block_n // 2, HEAD_DIM])
    typed = {"q_desc": qd, "do_desc": qd, "k_desc": kd, "v_desc": kd, "dk_desc": kd, "dv_desc": kd,
             "lse_desc": _stats_desc(block_m), "delta_desc": _stats_desc(block_m), "DQacc": "*fp32",
             "qk_scale": "fp32", "softmax_scale": "fp32"}
    params = list(inspect.signature(_dkdv_dq_kernel.fn).parameters)
    signature = {p: "constexpr" if p in constexprs else typed.get(p, "i32") for p in params}
    src = GluonASTSource(fn=_dkdv_dq_kernel, signature=signature,
                         constexprs={(params.index(k),): v for k, v in constexprs.items()},
                         attrs={(params.index("DQacc"),): [["tt.divisibility", 16]],
                                (params.index("s_pad"),): [["tt.divisibility", 16]]})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def main():
    print(f"triton {triton.__version__}")
    for d, stages, causal in ((128, 2, False), (128, 2, True), (64, 2, True), (64, 3, False)):
        start = time.perf_counter()
        try:
            compiled = compile_variant(HEAD_DIM=d, NUM_STAGES=stages, CAUSAL=causal)
        except Exception as err:  # noqa: BLE001
            while err.__cause__ is not None:
                err = err.__cause__
            print(f"d{d} s{stages} causal={causal}: FAIL {str(err).strip()[-700:]}")
            continue
        ptx = compiled.asm["ptx"]
        barriers = sorted(set(re.findall(r"bar\.sync\s+[^;]*;|barrier\.sync[^;]*;", ptx)))
        reds = len(re.findall(r"red\.[^ ]*global[^ ]*", ptx))
        print(f"d{d} s{stages} causal={causal}: {report(compiled)} red={reds} barriers={barriers} "
              f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
