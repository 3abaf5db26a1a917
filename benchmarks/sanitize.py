"""Small odd-shaped calls of every kernel, for `compute-sanitizer --tool memcheck`.

    compute-sanitizer --tool memcheck python benchmarks/sanitize.py
"""

import os

import torch

import flashtile
from flashtile.kernels import configs, hopper, tma

torch.manual_seed(0)
for (b, sq, sk, hq, hkv, d, causal) in [(1, 17, 33, 4, 2, 40, True), (2, 113, 17, 2, 1, 80, False),
                                          (1, 1, 203, 8, 8, 256, True)]:
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(hq, sq, sk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashtile.attention(q, k, v, causal=causal, bias=bias, dropout_p=0.1, window_size=(30, -1))
    out.sum().backward()
cu = torch.tensor([0, 5, 5, 40], dtype=torch.int32, device="cuda")
x = torch.randn(43, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
flashtile.flash_attn_varlen_func(x, x, x, cu, cu, 35, 35, causal=True).sum().backward()
# Packed sequences longer than a tile: the dK/dV pass reads LSE and D unmasked in whole tiles.
cu = torch.tensor([0, 130, 130, 333], dtype=torch.int32, device="cuda")
x = torch.randn(333, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
flashtile.flash_attn_varlen_func(x, x, x, cu, cu, 203, 203, causal=True).sum().backward()
kc = torch.randn(12, 16, 2, 64, device="cuda", dtype=torch.float16)
table = torch.randperm(12, device="cuda")[:8].view(2, 4).to(torch.int32)
flashtile.flash_attn_with_kvcache(torch.randn(2, 3, 4, 64, device="cuda", dtype=torch.float16), kc, kc.clone(),
                                  block_table=table, cache_seqlens=torch.tensor([50, 7], dtype=torch.int32,
                                                                               device="cuda"), causal=True)
# Split-KV decoding with its combine kernel (three splits of a 50-token cache).
flashtile.flash_attn_with_kvcache(torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.float16), kc, kc.clone(),
                                  block_table=table, cache_seqlens=torch.tensor([50, 7], dtype=torch.int32,
                                                                               device="cuda"), num_splits=3)
# Appending new tokens to a contiguous cache with left padding: the append index and the
# single-split path that stores straight into the query's dtype.
dense_k, dense_v = (torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16) for _ in range(2))
flashtile.flash_attn_with_kvcache(torch.randn(2, 2, 4, 64, device="cuda", dtype=torch.float16), dense_k, dense_v,
                                  k=torch.randn(2, 2, 2, 64, device="cuda", dtype=torch.float16),
                                  v=torch.randn(2, 2, 2, 64, device="cuda", dtype=torch.float16),
                                  cache_seqlens=torch.tensor([20, 37], dtype=torch.int32, device="cuda"),
                                  cache_leftpad=torch.tensor([3, 0], dtype=torch.int32, device="cuda"), causal=True)
# Block-sparse kernels: a document mask (partial and full tiles) with a score_mod.
ids = torch.tensor([0] * 30 + [1] * 45, dtype=torch.int32, device="cuda")
mask = flashtile.mask_mods.and_masks(flashtile.mask_mods.causal_mask(), flashtile.mask_mods.document_mask(ids))
qm = torch.randn(1, 75, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
# Rectangular tiles: the dK/dV pass then runs its own transposed lists (BlockMask.dkdv_blocks).
block_mask = flashtile.create_block_mask(mask, 1, 1, 75, 75, device="cuda", block_m=64, block_n=32)
flashtile.attention(qm, qm, qm, block_mask=block_mask,
                    score_mod=flashtile.score_mods.softcap_score(20.0)).sum().backward()


# Full tiles in two runs per row (sink tokens beside a window): the loop over runs
# (BlockMask.*_runs) in the forward and dQ passes.
def sink_and_window(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & ((kv_idx < 16) | (q_idx - kv_idx < 64))


qs = torch.randn(1, 150, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
runs_mask = flashtile.create_block_mask(sink_and_window, 1, 1, 150, 150, device="cuda", block_m=32, block_n=16)
assert not runs_mask.kv_full_range, "the loop over runs must be taken"
flashtile.attention(qs, qs, qs, mask_mod=sink_and_window, block_mask=runs_mask).sum().backward()
# New tokens appended to a paged cache across page boundaries (positions 14-16 and 30-32).
flashtile.flash_attn_with_kvcache(torch.randn(2, 3, 4, 64, device="cuda", dtype=torch.float16), kc, kc.clone(),
                                  k=torch.randn(2, 3, 2, 64, device="cuda", dtype=torch.float16),
                                  v=torch.randn(2, 3, 2, 64, device="cuda", dtype=torch.float16), block_table=table,
                                  cache_seqlens=torch.tensor([14, 30], dtype=torch.int32, device="cuda"), causal=True)
# Tiles through tensor descriptors (FLASHTILE_TMA=1, kernels/tma.py), odd lengths; the Gluon
# kernels off, or on sm_90 they would take these calls.
os.environ.update(FLASHTILE_TMA="1", FLASHTILE_GLUON="0", FLASHTILE_GLUON_BWD="0")
descriptor_launches = []  # the launches that build descriptors: the path must be taken, not assumed
make_descriptors = tma.tile_descriptors
tma.tile_descriptors = lambda *args: descriptor_launches.append(args) or make_descriptors(*args)
qt = torch.randn(2, 203, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
kt = torch.randn(2, 77, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
# Configs at 1 and 3 stages: Triton 3.6 keeps the pointer path at 2 (kernels/tma.py).
with configs.override(forward=configs.KernelConfig(128, 64, 8, 3),
                      backward=(configs.KernelConfig(64, 64, 4, 1), configs.KernelConfig(64, 64, 4, 1))):
    flashtile.attention(qt, kt, kt, causal=True).sum().backward()
assert len(descriptor_launches) == 3, "forward, dK/dV and dQ each take the descriptor path"
# The Gluon kernels (sm_90 only), forced on for every shape they cover: odd lengths, q != k,
# GQA, causal or not, d64, d128 and d256 (the backward's wide dK/dV kernel). Their LSE and dQ
# stores are plain stores.
os.environ.update(FLASHTILE_TMA="0", FLASHTILE_GLUON="1", FLASHTILE_GLUON_BWD="1")
if torch.cuda.get_device_capability() == (9, 0):
    gluon_calls = []
    for name in ("forward", "backward"):
        run = getattr(hopper, name)
        setattr(hopper, name, lambda *args, _run=run, _name=name, **kw: gluon_calls.append(_name) or _run(*args, **kw))
    for (b, sq, sk, hq, hkv, d, causal) in [(1, 17, 203, 4, 2, 64, True), (2, 203, 113, 6, 2, 128, False),
                                              (1, 130, 130, 2, 1, 128, True), (1, 1, 77, 2, 2, 256, True)]:
        qg = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        kg, vg = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                  for _ in range(2))
        flashtile.attention(qg, kg, vg, causal=causal).sum().backward()
    assert gluon_calls.count("forward") == 4 and gluon_calls.count("backward") == 4, gluon_calls
torch.cuda.synchronize()
print("sanitize: all kernels ran")
