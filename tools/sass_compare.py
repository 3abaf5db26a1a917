"""Whether a change alters the sm_90 machine code of the kernels, compiled on the CPU.

    PYTHONPATH=old/src python tools/sass_compare.py dump OLD_DIR [--only TEXT]
    PYTHONPATH=src     python tools/sass_compare.py dump NEW_DIR [--only TEXT]
    python tools/sass_compare.py diff OLD_DIR NEW_DIR

``dump`` compiles tools/compile_check.py's variants (Triton and Gluon; ``--only`` keeps those
whose name contains TEXT) with the flashtile tree on PYTHONPATH and the installed Triton, and
writes each one's SASS (nvdisasm, Triton's bundled copy) to DIR. A variant's constexprs that
the tree's kernel does not take are left out, so a tree from before a constexpr was added
compiles the same variant. ``diff`` reports, per variant in both directories, how many SASS
lines differ, byte for byte (parameter offsets included) and with the constant-bank offsets
and immediates masked (what moves when only the parameter list changed): a refactor that
claims to leave the binaries alone should show 0 in the first column. Exit status 1 when any
variant differs.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_lines  # noqa: E402  (beside this file)


def _file_name(variant: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", variant.lower()).strip("_") + ".sass"


def dump(directory: str, only: str | None) -> int:
    import triton

    import compile_check

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    os.makedirs(directory, exist_ok=True)
    everything = [*compile_check.variants(False), *((*g, None) for g in compile_check.gluon_variants(False))]
    for name, kernel, constexprs, warps, stages in everything:
        if only and only not in name:
            continue
        parameters = inspect.signature(kernel.fn).parameters
        # (DYNAMIC is compile_check's switch for the forward's TileCounter, not a parameter: kept
        # where the kernel has that counter, or its "dynamic" variants would build fixed turns)
        constexprs = {key: value for key, value in constexprs.items()
                      if key in parameters or (stages is None and key in compile_check.DESCRIPTOR_KEYS)
                      or (key == "DYNAMIC" and "TileCounter" in parameters)}
        compiled = (compile_check.compile_variant(kernel, constexprs, warps, stages) if stages is not None
                    else compile_check.compile_gluon_variant(kernel, constexprs, warps))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            sass = subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout
        with open(os.path.join(directory, _file_name(name)), "w") as out:
            out.write(sass)
        print(f"{name}: {len(sass.splitlines())} lines", flush=True)
    return 0


def _instructions(path: str, masked: bool) -> list[str]:
    """The SASS instructions of a dump, without addresses and encodings; ``masked`` also hides
    constant-bank offsets and immediates."""
    with open(path) as sass:
        lines = [text for _, text, _ in sass_lines.instructions(sass.read())]
    if masked:
        lines = [re.sub(r"0x[0-9a-f]+", "IMM", re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[PARAM]", text)) for text in lines]
    return lines


def diff(old: str, new: str) -> int:
    names = sorted(set(os.listdir(old)) & set(os.listdir(new)))
    changed = 0
    print(f"{'variant':60s} {'lines':>7s} {'differ':>7s} {'masked':>7s}")
    for name in names:
        counts = []
        for masked in (False, True):
            a, b = (_instructions(os.path.join(d, name), masked) for d in (old, new))
            counts.append(sum(1 for line in difflib.unified_diff(a, b, n=0, lineterm="")
                              if line[:1] in "+-" and line[:3] not in ("+++", "---")))
        changed += counts[0] > 0
        print(f"{name[:-5]:60s} {len(_instructions(os.path.join(new, name), False)):7d} {counts[0]:7d} {counts[1]:7d}")
    only_one = sorted(set(os.listdir(old)) ^ set(os.listdir(new)))
    if only_one:
        print(f"in one directory only: {', '.join(only_one)}")
    print(f"{changed} of {len(names)} variants differ")
    return 1 if changed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    dumping = commands.add_parser("dump", help="write each variant's SASS to DIR")
    dumping.add_argument("directory")
    dumping.add_argument("--only", metavar="TEXT", help="only the variants whose name contains TEXT")
    comparing = commands.add_parser("diff", help="compare two dumps")
    comparing.add_argument("old")
    comparing.add_argument("new")
    args = parser.parse_args(argv)
    return dump(args.directory, args.only) if args.command == "dump" else diff(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
