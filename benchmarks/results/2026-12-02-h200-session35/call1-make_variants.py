"""Session 35: copies of branch dq-last's src/ with one part of the dQ warp's conversion taken out
(timing only: dq is wrong where a part is missing), and one that records who converted."""
import pathlib, shutil
SRC = pathlib.Path("/work/dqlast/src")
OUT = pathlib.Path("/work/main/.scratch/s35")
F = "flashtile/kernels/gluon_dq_arrivals.py"
FENCE = '    gl.inline_asm_elementwise("fence.acq_rel.gpu; fence.proxy.async.global; mov.u32 $0, 0;", "=r", [],\n                              dtype=gl.int32, is_pure=False, pack=1)\n'
COPY = ('    mbarrier.expect(loaded, sum_copy_desc.block_type.nbytes)\n'
        '    tma_load(sum_copy_desc, [row, half * HALF_D], loaded, sum_box)\n'
        '    mbarrier.wait(loaded, conversions & 1)\n')
LOOP = ('    for first in gl.static_range(0, BLOCK_M, CHUNK):\n'
        '        part = sum_box.slice(first, CHUNK, dim=0).load(layout)\n'
        '        out.slice(first, CHUNK, dim=0).store((part * softmax_scale).to(out_box.dtype))\n')
STORE = ('    fence_async_shared()\n    bh = row // s_pad\n'
         '    tma_store(dq_desc, [bh // heads_q, bh % heads_q, row % s_pad, half * HALF_D], out_box)\n')
WAIT = '    tma.store_wait(0)\n    mbarrier.expect'
CONV = ('            convert_half(row, 0, sum_copy_desc, dq_desc, sum_box, out_box, loaded, conversions, heads_q, s_pad,\n'
        '                         softmax_scale, BLOCK_M, HEAD_DIM)\n'
        '            convert_half(row, 1, sum_copy_desc, dq_desc, sum_box, out_box, loaded, conversions + 1, heads_q, s_pad,\n'
        '                         softmax_scale, BLOCK_M, HEAD_DIM)\n')
WHO = CONV + ('            counter = Arrivals + (row // BLOCK_M)\n'
              '            gl.inline_asm_elementwise(\n'
              '                "{ .reg .pred lead; .reg .u32 lane; mov.u32 lane, %laneid; setp.eq.u32 lead, lane, 0;"\n'
              '                " mov.u32 $0, 0; @lead st.global.u32 [$1], $2; }",\n'
              '                "=r,l,r", [counter, gl.program_id(0) + 1000], dtype=gl.int32, is_pure=False, pack=1)\n')
variants = {
    "v_on": [],
    "v_nofence": [(FENCE, "")],
    "v_nowait": [(WAIT, "    mbarrier.expect")],
    "v_nocopy": [(COPY, "")],
    "v_noloop": [(LOOP, "")],
    "v_nostore": [(STORE, "")],
    "v_noconv": [(CONV, "")],
    "v_who": [(CONV, WHO)],
}
for name, edits in variants.items():
    dest = OUT / name / "src"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SRC, dest, ignore=shutil.ignore_patterns("__pycache__"))
    path = dest / F
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, (name, old[:60])
        text = text.replace(old, new)
    path.write_text(text)
print("ok")
