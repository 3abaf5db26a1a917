"""Find wgmma register operands that one product leaves for another to read as its own (sm_90 SASS).

Session 28 found ptxas of CUDA 12.8 (Triton 3.6's) and 12.9 compiling the d64 forward's in-turn
path, on 64-key tiles, so that P's operand for O += P V went into the registers Q had been loaded
into once before the loop: the next tile's S = Q Kᵀ then read P as Q, with no instruction between
that put Q back (13.4's, Triton 3.9's for sm_90, keeps them apart). The PTX was sound; only the
SASS showed it. This reads a kernel's SASS (cuobjdump -sass, or nvdisasm's listing with labels)
as a control-flow graph of instructions and reports every register that an
HGMMA reads as its A operand and that an HGMMA of the other orientation (a transposed B against
a plain one: P V against Q Kᵀ) reads next on some path, with no write to it between. Reads by the
same orientation are left alone: a loop-invariant operand read by a peeled copy of the same
product is fine.

    python tools/sass_operands.py KERNEL.sass ...    # the clashes of dumped SASS (sass_compare.py dump)

tools/compile_check.py runs it on every dense Gluon forward it builds.
"""

from __future__ import annotations

import os
import re
import sys
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_lines  # noqa: E402  (beside this file)

# "@!P0 LDSM.16.M88.4 R100, [R7+UR17+0x2000]" (sass_lines' text): predicate, opcode, operands
_FIELDS = re.compile(r"(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*(.*)")
_REGISTER = re.compile(r"^R(\d+)$")
_HGMMA_SHAPE = re.compile(r"HGMMA\.64x(\d+)x")
# The A operand of an HGMMA from registers: four 32-bit registers a thread for 16-bit inputs
# (a 64 x 16 slice over 128 threads); for 8-bit inputs the same four hold a 64 x 32 slice.
A_REGISTERS = 4


def _written(opcode: str) -> int:
    """How many consecutive registers an instruction writes from its first operand on."""
    shape = _HGMMA_SHAPE.match(opcode)
    if shape:  # the float32 accumulator: 64 x N over 128 threads
        return int(shape.group(1)) // 2
    last = opcode.rsplit(".", 1)[-1]
    if opcode.startswith("LDSM") and last.isdigit():  # LDSM ... .4: four matrices, a register each
        return int(last)
    if ".128" in opcode:
        return 4
    if ".64" in opcode or ".WIDE" in opcode:
        return 2
    return 1


def _parse(sass: str) -> list[tuple]:
    """(address, predicated, opcode, operands, labels) of each instruction, ``labels`` the nvdisasm
    labels (".L_x_12") just before it: cuobjdump -sass and nvdisasm -c (sass_compare.py's dumps)
    print the same instructions, branch targets as addresses in the first and labels in the second."""
    instructions = []
    for address, text, labels in sass_lines.instructions(sass):
        fields = _FIELDS.fullmatch(text)
        if fields:
            operands = fields.group(3).strip()
            instructions.append((address, bool(fields.group(1)), fields.group(2),
                                 [o.strip() for o in operands.split(",")] if operands else [], labels))
    return instructions


def _branch_target(operands: list[str], at: dict, named: dict) -> int:
    """The instruction index a BRA or JMP goes to: an address (cuobjdump) or a label (nvdisasm)."""
    target = operands[-1] if operands else ""
    address = re.fullmatch(r"0x([0-9a-f]+)", target)
    label = re.fullmatch(r"`\((\.L\w+)\)", target)
    if address and int(address.group(1), 16) in at:
        return at[int(address.group(1), 16)]
    if label and label.group(1) in named:
        return named[label.group(1)]
    raise ValueError(f"a branch to {target!r}, which is not an instruction of this listing")


def clashes(sass: str) -> list[str]:
    """Each register an HGMMA reads as its A operand that an HGMMA of the other B orientation reads
    next as its own on some path, with no write to it between: one line per reading site.
    Indirect branches (BRX, JMX: the partitions' dispatch at a warp-specialized kernel's start)
    end a path; a BRA or JMP whose target is not in the listing raises ValueError."""
    instructions = _parse(sass)
    at = {address: i for i, (address, *_) in enumerate(instructions)}
    named = {label: i for i, (*_, labels) in enumerate(instructions) for label in labels}
    successors, writes, a_reads = [], [], {}
    for i, (_, predicated, opcode, operands, _) in enumerate(instructions):
        following = [i + 1] if i + 1 < len(instructions) else []
        if opcode.startswith(("BRA", "JMP")):
            following = [_branch_target(operands, at, named)] + (following if predicated else [])
        elif opcode.startswith(("BRX", "JMX")) or (opcode.startswith(("EXIT", "RET")) and not predicated):
            following = following if predicated else []
        successors.append(following)
        first = _REGISTER.match(operands[0]) if operands else None
        writes.append(set(range(int(first.group(1)), int(first.group(1)) + _written(opcode))) if first else set())
        if opcode.startswith("HGMMA") and len(operands) > 2 and _REGISTER.match(operands[1]):
            base = int(_REGISTER.match(operands[1]).group(1))
            a_reads[i] = (set(range(base, base + A_REGISTERS)), ".tnspB" in operands[2])
    found = []
    for site, (registers, transposed) in a_reads.items():
        for register in sorted(registers):
            reader = _next_reader(site, register, successors, writes, a_reads)
            if reader is not None and a_reads[reader][1] != transposed:
                found.append(f"{instructions[site][0]:04x} {instructions[site][2]} reads R{register} as its A "
                             f"operand, and {instructions[reader][0]:04x} {instructions[reader][2]} reads it as "
                             "its own with no write between")
                break
    return found


def _next_reader(site: int, register: int, successors, writes, a_reads) -> int | None:
    """An HGMMA other than ``site`` that reads ``register`` as its A operand on a path from
    ``site`` with no write to it before, or None."""
    seen, queue = {site}, deque(successors[site])
    while queue:
        i = queue.popleft()
        if i in seen:
            continue
        seen.add(i)
        if i in a_reads and register in a_reads[i][0]:
            return i
        if register not in writes[i]:
            queue.extend(successors[i])
    return None


def main(paths: list[str]) -> int:
    failures = 0
    for path in paths:
        with open(path) as handle:
            found = clashes(handle.read())
        failures += bool(found)
        print(f"{'FAIL' if found else 'ok  '} {path}" + "".join(f"\n     {line}" for line in found[:4]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
