"""Session 36: copies of branch own-delta's src/ (attempt 84) that take its cost apart (timing only,
their Delta is wrong). Writes .scratch/s36/v84/<name>/src.
- nocompute: the Delta warps wait for dO and O and complete do_ready without reading them;
- noload: O is not copied (the Delta warps sum dO against whatever the O slot holds);
- hop: neither (dO lands, the Delta warps pass do_ready on: the hop through them alone)."""
import pathlib, shutil
SRC = pathlib.Path("/work/main/.scratch/s36/own/src")
OUT = pathlib.Path("/work/main/.scratch/s36/v84")
FUSED = "flashtile/kernels/gluon_bwd_fused.py"
COMMON = "flashtile/kernels/gluon_common.py"
LOOP = "        for first in gl.static_range(0, BLOCK_M, 8):\n"
variants = {
    "nocompute": [(FUSED, LOOP, "        for first in gl.static_range(0, 0, 8):\n")],
    "noload": [(COMMON, "do_desc.block_type.nbytes + o_desc.block_type.nbytes)", "do_desc.block_type.nbytes)"),
               (COMMON, "        tma_load(o_desc, [batch, head, m_start, 0], do_landed.index(slot), o_smem.index(slot))\n", "")],
}
variants["hop"] = variants["nocompute"] + variants["noload"]  # neither: the extra barrier hop alone
for name, edits in variants.items():
    dest = OUT / name / "src"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SRC, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, old, new in edits:
        path = dest / rel
        text = path.read_text()
        assert text.count(old) == 1, (name, rel, old[:60])
        path.write_text(text.replace(old, new))
print("ok")
