"""Session 35, for the next device time: copies of branch early-dq's src/ (attempt 83) that take its
parts apart, to find what made it slower (call 7). Writes .scratch/s35/v83/<name>/src.

- one_per_wg: one arrival a consumer warpgroup a key tile (thread 0 of the warpgroup), not one a
  warp: 2 GPU-scope release fences a key tile instead of 8 (the conversion expects 2 a key tile);
- count_only: the counts kept, the conversion launched as on main (no launch_pdl, no wait on the
  counts): what the consumers' side costs alone;
- pdl_only: no counts; the conversion launched with launch_pdl after programs that trigger it at
  their start, waiting for the whole grid at its start (griddepcontrol.wait): what the early launch
  costs alone.
"""
import pathlib, shutil
SRC = pathlib.Path("/tmp/earlydq/src")
OUT = pathlib.Path("/work/main/.scratch/s35/v83")
COMMON = "flashtile/kernels/gluon_common.py"
FUSED = "flashtile/kernels/gluon_bwd_fused.py"
HOPPER = "flashtile/kernels/hopper.py"
WARP_RED = ('''        "{ .reg .pred lead; elect.sync _|lead, 0xffffffff; fence.proxy.async.global;"
        " @lead red.release.gpu.global.add.u32 [$1], 1; mov.u32 $0, 0; }",''')
GROUP_RED = ('''        "{ .reg .pred lead; .reg .u32 t; mov.u32 t, %tid.x; and.b32 t, t, 127; setp.eq.u32 lead, t, 0;"
        " fence.proxy.async.global; @lead red.release.gpu.global.add.u32 [$1], 1; mov.u32 $0, 0; }",''')
CONVERT_ARGS = '''        *((head_done, group, 8 * num_n_blocks) if early else ()),
        HEAD_DIM=head_dim, BLOCK=rows, **({"WAIT_HEADS": True, "launch_pdl": True} if early else {}),'''
SIGNAL = '''        if SIGNAL_HEADS:  # (before the dK, dV stores, which the wait would otherwise take in too)
            count_written(HeadDone + batch * (heads_q // group_size) + head_kv)
'''
WAIT = '''    if WAIT_HEADS:
        count = HeadDone + (bh // heads_q) * (heads_q // group_size) + (bh % heads_q) // group_size
        seen = _load_acquire(count)
        while seen < arrivals:
            seen = _load_acquire(count, sleep=True)'''
variants = {
    "one_per_wg": [(COMMON, WARP_RED, GROUP_RED),
                   (HOPPER, "(head_done, group, 8 * num_n_blocks)", "(head_done, group, 2 * num_n_blocks)")],
    "count_only": [(HOPPER, CONVERT_ARGS, '''        HEAD_DIM=head_dim, BLOCK=rows,''')],
    "pdl_only": [(FUSED, SIGNAL, ""), (FUSED, WAIT, '''    if WAIT_HEADS:
        gdc_wait()''')],
}
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
