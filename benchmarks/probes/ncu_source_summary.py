"""Where two kernels' warps stall, instruction by instruction: a summary of Nsight Compute's source view.

    ncu --target-processes all -k regex:_dkdv_dq -c 2 --section SourceCounters --section WarpStateStats \\
        --section InstructionStats -o fused python benchmarks/probes/fused_bwd_ncu.py
    ncu -i fused.ncu-rep --page source --csv --print-source sass > fused-source.csv
    python benchmarks/probes/ncu_source_summary.py fused-source.csv

The CSV holds one table per profiled kernel (SASS address, instruction, stall samples by reason,
instructions executed, shared-memory wavefronts and their ideal). For the first two kernels
(fused_bwd_ncu.py profiles the non-causal, then the causal five-product backward; fwd_ncu.py the
same two forwards) this prints:

- the stall samples by reason, side by side, and their ratio;
- the samples and executed count by opcode: a ratio of samples above the ratio of instructions
  executed is an opcode whose instructions wait longer in the second kernel;
- the shared-memory accesses with more wavefronts than ideal (bank conflicts).

Samples of warps that only wait for the kernel's end are left out: NOPs stalled at a barrier
(the CTA's padding warps) and polling branches stalled on a long scoreboard (the loader's
mbarrier waits) count as "idle" and are not in the opcode table.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import re

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
WAVEFRONTS, IDEAL = "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"
IDLE_SAMPLES = 10000  # a NOP or branch with more barrier/long-scoreboard samples than this is a waiting warp's


def kernels(path: str) -> list:
    """[(kernel name, [row dicts])] from ncu's ``--page source --csv`` output."""
    text = open(path, encoding="utf-8").read()
    tables = []
    for part in text.split('"Kernel Name",')[1:]:
        name, _, body = part.partition("\n")
        tables.append((name.strip().strip('",'), list(csv.DictReader(io.StringIO(body)))))
    return tables


def number(row: dict, key: str) -> float:
    try:
        return float(row.get(key, "").replace(",", ""))
    except ValueError:
        return 0.0


def opcode(row: dict) -> str:
    """The instruction's opcode without predicate or modifiers; waiting warps' NOPs and polls as "idle"."""
    text = re.sub(r"^@!?U?P\w+\s+", "", row["Source"].strip())
    op = text.split(" ")[0].split(".")[0]
    if (op == "NOP" and number(row, "stall_barrier") > IDLE_SAMPLES) or (
            op == "BRA" and number(row, "stall_long_sb") > IDLE_SAMPLES):
        return "idle"
    return op


def summarize(rows: list) -> tuple:
    """(stall samples by reason, samples by opcode, executed by opcode), idle warps left out."""
    reasons, samples, executed = collections.Counter(), collections.Counter(), collections.Counter()
    stall_keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    for row in rows:
        op = opcode(row)
        samples[op] += number(row, SAMPLES)
        executed[op] += number(row, EXECUTED)
        if op == "idle":
            continue
        for key in stall_keys:
            reasons[key] += number(row, key)
    return reasons, samples, executed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass")
    parser.add_argument("--top", type=int, default=20, help="opcodes to list")
    args = parser.parse_args()
    (name_a, rows_a), (name_b, rows_b) = kernels(args.csv)[:2]
    (reasons_a, samples_a, executed_a), (reasons_b, samples_b, executed_b) = summarize(rows_a), summarize(rows_b)
    print(f"A: {name_a}, {len(rows_a)} instructions;  B: {name_b}, {len(rows_b)} instructions")
    print(f"idle warps' samples (left out below): A {samples_a['idle']:.0f} of {sum(samples_a.values()):.0f}, "
          f"B {samples_b['idle']:.0f} of {sum(samples_b.values()):.0f}")
    print("\nstall reason               A          B      B/A")
    for key, value in reasons_a.most_common():
        if value > 0.001 * sum(reasons_a.values()):
            print(f"{key:22s} {value:10.0f} {reasons_b[key]:10.0f} {reasons_b[key] / value:8.3f}")
    print("\nopcode        samples A  samples B    B/A | executed A   executed B    B/A")
    ops = [op for op, _ in samples_a.most_common() if op != "idle"][:args.top]
    for op in ops:
        print(f"{op:12s} {samples_a[op]:10.0f} {samples_b[op]:10.0f} {samples_b[op] / max(samples_a[op], 1):6.3f} | "
              f"{executed_a[op]:11.0f} {executed_b[op]:11.0f} {executed_b[op] / max(executed_a[op], 1):6.3f}")
    for label, rows in (("A", rows_a), ("B", rows_b)):
        conflicted = [r for r in rows if number(r, WAVEFRONTS) > number(r, IDEAL) > 0]
        excess = sum(number(r, WAVEFRONTS) - number(r, IDEAL) for r in conflicted)
        total = sum(number(r, WAVEFRONTS) for r in rows)
        print(f"\n{label}: {len(conflicted)} shared-memory instructions over their ideal wavefronts, "
              f"{excess:.0f} excess of {total:.0f} ({excess / max(total, 1):.1%})")
        for row in conflicted[:8]:
            print(f"   {row['Address'][-5:]}  {row['Source'].strip()[:44]:44s} "
                  f"{number(row, WAVEFRONTS) / max(number(row, EXECUTED), 1):.0f} wavefronts an instruction, "
                  f"ideal {number(row, IDEAL) / max(number(row, EXECUTED), 1):.0f}")


if __name__ == "__main__":
    main()
