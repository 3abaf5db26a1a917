"""Does each kernel's main loop keep its copies in flight? Read from the sm_90 SASS, no GPU.

Triton pipelines a K/V loop by issuing the copies of later tiles (cp.async, LDGSTS) before
the current tile's math and waiting, at the top of each iteration, until at most
``num_stages - 1`` groups of copies are still in flight (``DEPBAR.LE SB0, 0x2`` at 3 stages).
A loop whose next address depends on a load made in the loop (a block mask's tile list, a
paged cache's block table) can come out waiting for *every* copy in flight
(``DEPBAR.LE SB0, 0x0``): the pipeline drains each iteration, which no instruction count
shows. This prints, per variant, every loop of more than 200 instructions that issues copies,
with its waits, and marks those whose first wait is 0x0:

    python tools/pipeline_waits.py
"""

from __future__ import annotations

import re
import sys

import sass_lines
from compile_check import PLAIN, compile_variant, cuobjdump

from flashtile.kernels.bwd import _bwd_dkdv_kernel, _bwd_dq_kernel
from flashtile.kernels.decode import _decode_kernel
from flashtile.kernels.fwd import _fwd_kernel
from flashtile.mask_mods import causal_mask


def copy_loops(text: str, min_length: int = 200) -> list[tuple[int, int, list[str]]]:
    """(instructions, async copies, waits) of each backward branch's loop body that issues
    copies and is at least ``min_length`` long; waits are the DEPBAR.LE SB0 counts in order."""
    lines = [(address, instruction) for address, instruction, _ in sass_lines.instructions(text)]
    index = {address: i for i, (address, _) in enumerate(lines)}
    found = []
    for i, (_, instruction) in enumerate(lines):
        target = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", instruction)
        if not target or int(target.group(1), 16) not in index or index[int(target.group(1), 16)] >= i:
            continue
        body = [ins for _, ins in lines[index[int(target.group(1), 16)]: i + 1]]
        copies = sum("LDGSTS" in ins for ins in body)
        waits = [m.group(1) for m in (re.search(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", ins) for ins in body) if m]
        if copies and len(body) >= min_length:
            found.append((len(body), copies, waits))
    return found


def variants():
    """(name, kernel, constexprs, warps, stages): the table's configs at d128, causal, and a
    block mask's (one run of full tiles per row, or several)."""
    d128 = dict(PLAIN, HEAD_DIM=128, HEAD_DIM_PADDED=128)
    causal = dict(d128, HAS_RIGHT=True)
    masked = dict(d128, MASK_MOD=causal_mask().triton_fn(), FULL_RANGE=True)  # one run of full tiles per row
    runs = dict(masked, FULL_RANGE=False)  # several runs per row (sink tokens and a window): a loop over runs
    for name, flags in (("built-in causal", causal), ("mask_mod causal", masked), ("mask_mod runs", runs)):
        yield f"fwd {name}", _fwd_kernel, dict(flags, BLOCK_M=128, BLOCK_N=128), 8, 3
        yield f"dq {name}", _bwd_dq_kernel, dict(flags, BLOCK_M=128, BLOCK_N=64, HAS_DBIAS=False), 8, 3
        yield f"dkdv {name}", _bwd_dkdv_kernel, dict(flags, BLOCK_M=64, BLOCK_N=128), 8, 3
    for paged in (False, True):
        yield (f"decode paged={paged}", _decode_kernel,
               dict(d128, BLOCK_M=16, BLOCK_N=64, PAGED=paged, HAS_BATCH_IDX=False, HAS_LEFTPAD=False), 4, 3)


def main() -> int:
    for name, kernel, constexprs, warps, stages in variants():
        for length, copies, waits in copy_loops(cuobjdump(compile_variant(kernel, constexprs, warps, stages), "-sass")):
            drains = bool(waits) and waits[0] == "0x0"
            print(f"{name:24s} loop {length:5d} instructions {copies:4d} copies  waits {' '.join(waits) or '-'}"
                  f"{'  DRAINS' if drains else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
