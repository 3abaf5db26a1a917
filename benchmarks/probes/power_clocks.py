"""The GPU's SM clock, power and clock-event reasons while each library's forward runs.

    python benchmarks/probes/power_clocks.py [--seconds 4] [--cells 64:4096 128:16384]
                                             [--providers flashtile sdpa-flash sdpa-cudnn]

Session 27 saw flashtile's forward vary 3-10% from round to round of the same cell (and a CUDA
graph of it read faster than eager calls right after it), where FA2's did not move by 0.5%
(probes/bench_vs_graph.py). One reading is power: a kernel at 500-600 TFLOP/s may hold the H200
at its power limit, where the driver lowers the SM clock. This probe runs each provider's
forward back to back (a CUDA graph of 20 calls, replayed) for ``--seconds`` on each cell (d:N,
B·N = 16k tokens, H = 2048 / d, bf16, non-causal and causal), while ``nvidia-smi`` samples every
50 ms, and prints per phase the calls' TFLOP/s and the samples' median SM clock, median and
largest power draw, temperature and the clock-event reasons seen (the driver's bit mask).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import capture  # noqa: E402

import flashtile  # noqa: E402

CALLS_PER_GRAPH = 20  # a replay long enough that the host loop between replays costs nothing
QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def providers(q, k, v, causal: bool) -> dict:
    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call

    return {
        "flashtile": lambda: flashtile.attention(q, k, v, causal=causal, layout="bhsd"),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }


def run_phase(graph: torch.cuda.CUDAGraph, seconds: float) -> tuple[float, float, int]:
    """(start, end) wall times and the graph's replays in ``seconds`` (synchronised at both ends)."""
    torch.cuda.synchronize()
    start = time.time()
    replays = 0
    while time.time() - start < seconds:
        graph.replay()
        replays += 1
        if replays % 4 == 0:
            torch.cuda.synchronize()  # keep the queue short, so the phase ends when its time does
    torch.cuda.synchronize()
    return start, time.time(), replays


def parse(lines: list) -> list:
    """(epoch seconds, sm MHz, watts, °C, reasons) of nvidia-smi's CSV lines."""
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            stamp += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            samples.append((stamp, float(parts[1].split()[0]), float(parts[2].split()[0]),
                            float(parts[3]), parts[4]))
        except (ValueError, IndexError):
            continue
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--cells", nargs="+", default=["64:4096", "128:16384"])
    parser.add_argument("--providers", nargs="+", default=["flashtile", "sdpa-flash", "sdpa-cudnn"])
    args = parser.parse_args()
    # Line-buffered (stdbuf), and stopped with SIGINT: session 27's first run, block-buffered into
    # the pipe and stopped with SIGTERM, lost its last phases' samples with the buffer.
    command = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader", "-lms", "50"]
    if shutil.which("stdbuf"):
        command = ["stdbuf", "-oL", *command]
    smi = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    phases = []
    try:
        for cell in args.cells:
            d, n = (int(x) for x in cell.split(":"))
            batch, heads = max(16384 // n, 1), 2048 // d
            q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
                for name, fn in providers(q, k, v, causal).items():
                    if name not in args.providers:
                        continue
                    graph = capture(fn, calls=CALLS_PER_GRAPH)
                    time.sleep(1.0)  # a gap between phases, so each starts from about the same state
                    start, end, replays = run_phase(graph, args.seconds)
                    tflops = flops * CALLS_PER_GRAPH * replays / (end - start) * 1e-12
                    phases.append((f"d{d} {'causal' if causal else 'full'} {n}", name, start, end, tflops))
                    print(f"{phases[-1][0]} {name}: {tflops:.1f} TFLOP/s", flush=True)
    finally:
        time.sleep(0.2)
        smi.send_signal(signal.SIGINT)
        try:
            output = smi.communicate(timeout=5)[0]
        except subprocess.TimeoutExpired:
            smi.kill()
            output = smi.communicate()[0]
    samples = parse(output.splitlines())
    if not samples:
        print("nvidia-smi gave no samples:\n" + output[:2000])
        return
    print(f"\n{len(samples)} samples; per phase (its first 0.5 s left out):")
    print(f"{'cell':<18} {'provider':<11} {'TFLOP/s':>8} {'SM MHz':>7} {'W med':>6} {'W max':>6} {'°C':>4}  reasons")
    for cell, name, start, end, tflops in phases:
        inside = [s for s in samples if start + 0.5 <= s[0] <= end]
        if not inside:
            print(f"{cell:<18} {name:<11} {tflops:8.1f}  (no samples)")
            continue
        reasons = sorted({s[4] for s in inside})
        print(f"{cell:<18} {name:<11} {tflops:8.1f} {statistics.median(s[1] for s in inside):7.0f} "
              f"{statistics.median(s[2] for s in inside):6.0f} {max(s[2] for s in inside):6.0f} "
              f"{statistics.median(s[3] for s in inside):4.0f}  {' '.join(reasons)}")


if __name__ == "__main__":
    main()
