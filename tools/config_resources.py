"""Registers and spill bytes of each launch config of one kernel, compiled for sm_90 on any machine.

A CPU-side aid for tuning: configs that spill heavily are unlikely winners, so a GPU sweep
(benchmarks/tune_configs.py) can start from the ones that do not. The numbers are the
compiler's; whether a spill costs time (it may sit outside the K/V loop) only the GPU says.

    python tools/config_resources.py --kernel fwd --headdim 128 --causal
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_check import PLAIN, compile_variant, resource_usage  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", choices=["fwd", "dkdv", "dq"], default="fwd")
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    args = p.parse_args(argv)

    from flashtile.kernels.bwd import _bwd_dkdv_kernel, _bwd_dq_kernel
    from flashtile.kernels.fwd import _fwd_kernel

    kernel = {"fwd": _fwd_kernel, "dkdv": _bwd_dkdv_kernel, "dq": _bwd_dq_kernel}[args.kernel]
    flags = dict(PLAIN, HEAD_DIM=args.headdim, HEAD_DIM_PADDED=args.headdim, HAS_RIGHT=args.causal, HAS_DBIAS=False)
    print(f"{args.kernel} d={args.headdim} {'causal' if args.causal else 'full'}: BLOCK_M x BLOCK_N, warps, stages")
    for bm, bn, warps, stages in itertools.product(args.blocks, args.blocks, args.warps, args.stages):
        try:
            compiled = compile_variant(kernel, dict(flags, BLOCK_M=bm, BLOCK_N=bn), warps, stages)
        except Exception as err:  # noqa: BLE001 - a config that does not compile is a row too
            print(f"{bm:4d} x {bn:<4d} w{warps} s{stages}  does not compile: {str(err).splitlines()[-1][:80]}")
            continue
        print(f"{bm:4d} x {bn:<4d} w{warps} s{stages}  {resource_usage(compiled)}  "
              f"smem={compiled.metadata.shared // 1024} KiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
