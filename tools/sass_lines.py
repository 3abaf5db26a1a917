"""sm_90 SASS as cuobjdump -sass and nvdisasm print it, read line by line: each instruction's
address and text, and the labels nvdisasm prints before it. What tools/pipeline_waits.py,
sass_compare.py and sass_operands.py read."""

from __future__ import annotations

import re

# "        /*0950*/                   @!P0 LDSM.16.M88.4 R100, [R7+UR17+0x2000] ;   /* 0x000fe2... */":
# the address (five digits past 0xffff), then the instruction up to its ";" (the encoding after it
# left out)
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_LABEL = re.compile(r"^\s*(\.L\w+):\s*$")


def instructions(sass: str) -> list[tuple[int, str, list[str]]]:
    """(address, text, labels) of each instruction: ``text`` its predicate, opcode and operands
    without the address or encoding, ``labels`` the nvdisasm labels (".L_x_12") just before it
    (cuobjdump prints none: its branch targets are addresses)."""
    found, labels = [], []
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            labels.append(label.group(1))
            continue
        match = _INSTRUCTION.match(line)
        if match:
            found.append((int(match.group(1), 16), match.group(2).strip(), labels))
            labels = []
    return found
