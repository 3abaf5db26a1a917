"""HBM bytes of flashtile and of standard attention, measured with Nsight Compute beside the IO model.

Two modes. ``run`` executes one pass (inside an NVTX range named ``measure``, after an
unprofiled warm-up) and is what ncu profiles; ``table`` runs ncu on ``run`` for each
case, sums ``dram__bytes_read.sum`` and ``dram__bytes_write.sum`` over the pass's
kernels and prints them beside ``flashtile.io``'s counts:

    python benchmarks/io_measure.py table --seqlens 1024 4096 16384 --headdims 64 128

bf16, batch 1, heads 16, non-causal (the model's case). The tiled model uses the tile
sizes the kernels launched with (``flashtile.kernels.configs``). Needs ncu on the PATH
and a runtime that exposes the DRAM counters.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys

UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}
METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"
HEADS = 16


def run_pass(impl: str, direction: str, seqlen: int, headdim: int) -> None:
    """One forward or backward pass of ``impl`` ('flashtile' or 'standard') inside NVTX 'measure'."""
    import torch

    import flashtile

    q, k, v = (torch.randn(1, seqlen, HEADS, headdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    fn = flashtile.attention if impl == "flashtile" else (
        lambda q, k, v: flashtile.naive_attention(q, k, v, upcast=False))
    dout = torch.randn_like(q)
    # An NVTX push/pop range belongs to one thread, and autograd runs a CUDA backward on its
    # own worker thread: keep the backward on this one, or ncu sees none of its kernels.
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(2):  # warm-up: compilation and the allocator, outside the range
            out = fn(q, k, v)
            torch.autograd.grad(out, (q, k, v), dout)
        out = fn(q, k, v) if direction == "bwd" else None  # the measured backward's forward: outside the range
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("measure")
        if direction == "fwd":
            fn(q, k, v)
        else:
            torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def parse_ncu_csv(text: str) -> tuple[float, float, int]:
    """(bytes read, bytes written, kernels) summed over every kernel row of ncu's CSV output."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    read = written = 0.0
    kernels = set()
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        name, unit, value = row.get("Metric Name"), (row.get("Metric Unit") or "byte"), row.get("Metric Value")
        if name not in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            continue
        try:  # "n/a" where a counter could not be read: that kernel does not count
            amount = float((value or "").replace(",", "")) * UNITS[unit.strip().lower()]
        except (ValueError, KeyError):
            continue
        kernels.add(row.get("ID"))
        if name == "dram__bytes_read.sum":
            read += amount
        else:
            written += amount
    return read, written, len(kernels)


def model_bytes(impl: str, direction: str, seqlen: int, headdim: int) -> float:
    import torch

    from flashtile.io import standard_attention_io, tiled_attention_io
    from flashtile.kernels.configs import backward_configs, forward_config

    if impl == "standard":
        counts = standard_attention_io(seqlen, headdim, heads=HEADS)
    else:
        device = torch.device("cuda", 0)
        fwd = forward_config(headdim, torch.bfloat16, False, device, seqlen)
        dkdv, dq = backward_configs(headdim, torch.bfloat16, False, device)
        # The model's block_m is the resident Q tile: the forward's, or the dQ kernel's.
        block_m = fwd.BLOCK_M if direction == "fwd" else dq.BLOCK_M
        counts = tiled_attention_io(seqlen, headdim, heads=HEADS, block_m=block_m, block_n=dkdv.BLOCK_N)
    traffic = counts.forward if direction == "fwd" else counts.backward
    return traffic.read_bytes + traffic.write_bytes


def table(seqlens, headdims) -> int:
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu: not on the PATH", file=sys.stderr)
        return 1
    print(f"bf16, batch 1, heads {HEADS}, non-causal; GB moved (read + written) per pass")
    print(f"{'impl':>9} {'pass':>4} {'d':>4} {'N':>6} | {'measured':>9} {'model':>9} {'measured/model':>14} | kernels")
    for headdim in headdims:
        for seqlen in seqlens:
            for impl in ("flashtile", "standard"):
                for direction in ("fwd", "bwd"):
                    cmd = [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "--metrics", METRICS,
                           "--nvtx", "--nvtx-include", "measure/",
                           sys.executable, __file__, "run", impl, direction, str(seqlen), str(headdim)]
                    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
                    read, written, kernels = parse_ncu_csv(done.stdout)
                    model = model_bytes(impl, direction, seqlen, headdim)
                    measured = read + written
                    if kernels == 0:
                        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                        print(f"{impl:>9} {direction:>4} {headdim:>4} {seqlen:>6} | no kernels profiled: "
                              f"{tail[0][:90]}")
                        continue
                    print(f"{impl:>9} {direction:>4} {headdim:>4} {seqlen:>6} | {measured / 1e9:9.3f} "
                          f"{model / 1e9:9.3f} {measured / model:14.2f} | {kernels}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("impl", choices=["flashtile", "standard"])
    r.add_argument("direction", choices=["fwd", "bwd"])
    r.add_argument("seqlen", type=int)
    r.add_argument("headdim", type=int)
    t = sub.add_parser("table")
    t.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    t.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    args = p.parse_args(argv)
    # The model counts the Triton kernels' traffic: on sm_90 the Gluon kernels would take these calls.
    os.environ.update(FLASHTILE_GLUON="0", FLASHTILE_GLUON_BWD="0")
    if args.mode == "run":
        run_pass(args.impl, args.direction, args.seqlen, args.headdim)
        return 0
    return table(args.seqlens, args.headdims)


if __name__ == "__main__":
    sys.exit(main())
