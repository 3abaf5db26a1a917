"""A causal mask_mod against the built-in causal kernels, over the block mask's tile choices.

    python benchmarks/mask_tiles.py schedule   # longest-first programs (BlockMask.*_order) vs identity
    python benchmarks/mask_tiles.py configs    # backward warps/stages forced over the table's
    python benchmarks/mask_tiles.py ranges     # full tiles as one range, run by run, tile by tile

``schedule``: each block mask is timed twice, as built (programs with the longest tile lists
first) and with its ``kv_order``/``dq_order``/``q_order`` replaced by the identity, at
forward tiles 128 x 64 and 128 x 128 and backward key widths 64 and 128.
``configs``: the table's configs, then (dK/dV, dQ) warps and stages forced through
``configs.override`` (the mask's tile sizes still rule). Both print fwd / bwd ms (the backward
alone, masks.time_fwd_bwd) and their ratio to the built-in causal (16 heads, batch 1, bf16).
``ranges``: causal and causal document masks (``--docs``), and sink tokens beside a causal
window, each block mask timed three ways: as built (one run of full tiles per row: walked
as one range, ``*_full_range``; the sink mask has two runs), through the loop over runs
(``*_full_range`` forced False: the cost of nesting the range loop), and tile by tile (every
run cut to one tile: the pipeline drains each tile, as the list walk before attempt 19).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from masks import time_fwd_bwd

import flashtile
from flashtile.kernels import configs
from flashtile.kernels.configs import KernelConfig
from flashtile.mask_mods import and_masks, causal_mask, document_mask


def identity_order(bm):
    """The block mask with its programs in index order (the schedule before attempt 14)."""
    def ident(t):
        return torch.arange(t.shape[-1], device=t.device, dtype=t.dtype).expand(t.shape).contiguous()
    return dataclasses.replace(bm, kv_order=ident(bm.kv_order), dq_order=ident(bm.dq_order), q_order=ident(bm.q_order))


def through_runs(bm):
    """The block mask with its full tiles walked through the loop over runs in every pass."""
    return dataclasses.replace(bm, kv_full_range=False, dq_full_range=False, q_full_range=False)


def tile_by_tile(bm):
    """The same with every run one tile long: the pipeline drains at each full tile."""
    return dataclasses.replace(through_runs(bm), **{f"{p}_runs": (getattr(bm, f"{p}_runs") > 0).to(torch.int32)
                                                    for p in ("kv", "dq", "q")})


def sink_and_window(b, h, q_idx, kv_idx):
    # Attention sinks (the first 128 keys) beside a causal window of 2048: two runs per row.
    return (kv_idx <= q_idx) & ((kv_idx < 128) | (q_idx - kv_idx < 2048))


def forced(warps_dkdv, stages_dkdv, warps_dq, stages_dq):
    # Tile sizes 0: _with_blocks puts the block mask's in.
    return KernelConfig(0, 0, warps_dkdv, stages_dkdv), KernelConfig(0, 0, warps_dq, stages_dq)


SCHEDULE_CASES = [(64, 64), (128, 64), (128, 128)]  # (block_n, backward_block_n)
RANGES_CASES = [(64, 64), (128, 64)]
CONFIG_CASES = [  # (block_n, backward_block_n, forced backward configs or None for the table)
    (64, 64, None), (64, 32, None), (128, 64, None),
    (64, 64, forced(8, 3, 4, 3)), (128, 64, forced(8, 3, 4, 3)), (64, 64, forced(8, 2, 4, 3)),
    (128, 128, forced(8, 3, 8, 3)), (128, 128, forced(8, 2, 8, 2)),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("sweep", choices=["schedule", "configs", "ranges"])
    p.add_argument("--docs", type=int, nargs="+", default=[4, 16, 64], help="ranges: documents per mask")
    p.add_argument("--headdims", type=int, nargs="+", default=[128, 64])
    p.add_argument("--seqlens", type=int, nargs="+", default=[16384, 4096])
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (meaningless times)")
    args = p.parse_args()
    causal = causal_mask()
    for d in args.headdims:
        for n in args.seqlens:
            q, k, v = (torch.randn(1, n, 16, d, device=args.device, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            base = time_fwd_bwd(lambda q, k, v: flashtile.attention(q, k, v, causal=True), q, k, v)
            print(f"d={d} N={n} built-in causal {base[0]:.3f} / {base[1]:.3f} ms", flush=True)
            masks = [("causal", causal)]
            if args.sweep == "ranges":
                for docs in args.docs:
                    ids = torch.arange(n, device=args.device, dtype=torch.int32) // max(n // docs, 1)
                    masks.append((f"{docs} docs", and_masks(causal, document_mask(ids))))
                masks.append(("sink+window", sink_and_window))
            runs = []  # (label, mask, block mask, forced backward configs or None)
            cases = {"schedule": SCHEDULE_CASES, "configs": CONFIG_CASES, "ranges": RANGES_CASES}[args.sweep]
            for name, mask in masks:
                for block_n, bwd_n, *over in cases:
                    bm = flashtile.create_block_mask(mask, 1, 1, n, n, device=args.device, block_n=block_n,
                                                     backward_block_n=bwd_n)
                    tiles = f"128x{block_n} bwd_n={bwd_n}"
                    if args.sweep == "schedule":
                        runs += [(f"{tiles} longest-first", mask, bm, None),
                                 (f"{tiles} identity", mask, identity_order(bm), None)]
                    elif args.sweep == "ranges":
                        runs += [(f"{name} {tiles} as built", mask, bm, None),
                                 (f"{name} {tiles} run loop", mask, through_runs(bm), None),
                                 (f"{name} {tiles} tile by tile", mask, tile_by_tile(bm), None)]
                    else:
                        dkdv, dq = over[0] or (None, None)
                        label = "table" if dkdv is None else (f"dkdv w{dkdv.num_warps}s{dkdv.num_stages} "
                                                              f"dq w{dq.num_warps}s{dq.num_stages}")
                        runs.append((f"{tiles} {label}", mask, bm, over[0]))
            for label, mask, bm, over in runs:
                try:
                    with configs.override(backward=over):
                        t = time_fwd_bwd(lambda q, k, v: flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm),
                                         q, k, v)
                    print(f"  {label:44s} {t[0]:.3f} / {t[1]:.3f} ms  ({t[0] / base[0]:.2f} / {t[1] / base[1]:.2f})",
                          flush=True)
                except Exception as e:  # noqa: BLE001 - a tiling that does not fit: report it, go on
                    print(f"  {label}: {type(e).__name__} {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()
