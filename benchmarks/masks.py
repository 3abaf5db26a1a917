"""User masks on the GPU: mask_mod against the built-in band, document masks against the
tiles they visit, and FlexAttention with the same masks in the same run (issue 4's targets).

bf16, batch 1, heads 16, headdim 128, N = --seqlen (default 16384). Rows, fwd / bwd / step ms
(bwd: the backward alone, retain_graph; step: forward + torch.autograd.grad, eager):

    built-in causal          flashtile.attention(causal=True): on sm_90 the Gluon kernels
    built-in causal, Triton  the same with FLASHTILE_GLUON=0 and FLASHTILE_GLUON_BWD=0: the
                             kernel family the mask_mod rows run, so that the mask's own cost
                             and the Gluon kernels' lead can be told apart
    mask_mod causal          the same through a block mask (causal_mask()), built once with
                             create_block_mask's default tiles (the kernels choose the key tiles)
    mask_mod causal, 128x64  the same on 128 × 64 forward tiles given (the Triton kernels')
    mask_mod causal, 128x128 the same on 128 × 128 forward tiles (the built-in's at this size);
                             the backward keeps 64-wide key tiles (BlockMask.backward_blocks)
    mask_mod causal, by def. the same without a block mask: attention() builds one with its
                             default tiles (hopper.default_block_mask_tiles)
    document mask (k docs)   and_masks(causal, document) with k equal documents; the
                             visited-tile fraction is printed beside it: cost should follow it
    flex: ...                torch's flex_attention (compiled) with the same mask_mod

    python benchmarks/masks.py --seqlen 16384 --docs 1 4 16
    python benchmarks/masks.py --device cpu --seqlen 256 --docs 2 --no-flex   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
from timing import median_ms

import flashtile
from flashtile.bench.environ import environment
from flashtile.mask_mods import and_masks, causal_mask, document_mask


def causal_documents(seqlen: int, docs: int, device, **tiles):
    """The document rows' mask, which the probes time too: ``docs`` equal documents of a
    ``seqlen``-long sequence, causal within each. Returns the document ids ((seqlen,) int32),
    the mask_mod and its block mask over one batch and head, on create_block_mask's default
    tiles unless ``tiles`` (block_m=, block_n=) say otherwise."""
    ids = torch.arange(seqlen, device=device, dtype=torch.int32) // (seqlen // docs)
    mask = and_masks(causal_mask(), document_mask(ids))
    return ids, mask, flashtile.create_block_mask(mask, 1, 1, seqlen, seqlen, device=device, **tiles)


def triton_kernels_only():
    """The Triton kernels for plain attention too (the Gluon switches off) inside the block."""
    return environment({"FLASHTILE_GLUON": "0", "FLASHTILE_GLUON_BWD": "0"})


def time_fwd_bwd(fn, q, k, v, warmup: int = 5, rep: int = 30):
    """(forward, backward, step) ms of ``fn(q, k, v)``. The backward alone, through
    ``retain_graph`` on one forward's graph, as flash-attn's, FlexAttention's and ``flashtile
    bench``'s own timings take it; the step is forward + ``torch.autograd.grad``, eager. Until
    session 19 the backward column was the step less a forward timed apart: on a host-bound cell
    (16 documents) that difference of two host-bound timings swung by ±20% from run to run.
    ``warmup``, ``rep``: do_bench's, in ms."""
    out = fn(q, k, v)
    dout = torch.randn_like(out)
    fwd = median_ms(lambda: fn(q, k, v), q.device, warmup=warmup, rep=rep)
    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), q.device, warmup=warmup,
                    rep=rep)
    step = median_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout), q.device, warmup=warmup, rep=rep)
    return fwd, bwd, step


def _three(values, spec: str) -> str:
    return " / ".join(format(x, spec) for x in values)


def _over(values, base) -> tuple:
    return tuple(x / b for x, b in zip(values, base))


def flex_fn(ids, causal: bool, batch, heads, n, device):
    """FlexAttention, compiled as its docs ask, with the same mask written as a plain closure
    (document ids ``ids`` or None, and causal); None where torch lacks it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if ids is None:
            def mask(b, h, q_idx, kv_idx):
                return q_idx >= kv_idx
        else:
            def mask(b, h, q_idx, kv_idx):
                return (ids[q_idx] == ids[kv_idx]) & ((q_idx >= kv_idx) | (not causal))

        flex_mask = create_block_mask(mask, batch, heads, n, n, device=device)
        # Its compiled backward may donate buffers it saved to its gradients (a memory saving; it
        # does with these transposed inputs), and then refuses the backward's retain_graph.
        import torch._functorch.config

        torch._functorch.config.donated_buffer = False
    except Exception as e:  # noqa: BLE001 - a baseline's failure must not end the run
        print(f"flex: unavailable ({type(e).__name__}: {str(e)[:80]})")
        return None
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    block_mask=flex_mask).transpose(1, 2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--docs", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over every row, each row's times the median of its rounds (rows of equal GPU work "
                        "read up to 8%% apart in one pass, session 19)")
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (meaningless times)")
    args = p.parse_args()
    n, heads, d, batch, device = args.seqlen, 16, 128, 1, args.device
    q, k, v = (torch.randn(batch, n, heads, d, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    rows = []  # (name, visited tile fraction or None, fn(q, k, v), flex's mask: ids or None, Triton kernels only)
    rows.append(("built-in causal", None, lambda q, k, v: flashtile.attention(q, k, v, causal=True), None, False))
    rows.append(("built-in causal, Triton", None, lambda q, k, v: flashtile.attention(q, k, v, causal=True), None,
                 True))
    causal = causal_mask()
    # create_block_mask's default key tiles are the kernels' choice: 64 keys on the Triton kernels,
    # 128 where the block-sparse Gluon forward runs (block_n=None; hopper._forward_block_mask).
    block = flashtile.create_block_mask(causal, 1, 1, n, n, device=device)
    rows.append(("mask_mod causal", block.visited_fraction,
                 lambda q, k, v: flashtile.attention(q, k, v, mask_mod=causal, block_mask=block), None, False))
    # The same mask on tiles given: 128 × 64 (the Triton kernels' and the default before session
    # 15) and 128 × 128 (the built-in causal's at this size), to tell the tile shape from the mask.
    narrow = flashtile.create_block_mask(causal, 1, 1, n, n, device=device, block_n=64)
    rows.append(("mask_mod causal, 128x64", narrow.visited_fraction,
                 lambda q, k, v: flashtile.attention(q, k, v, mask_mod=causal, block_mask=narrow), None, False))
    square = flashtile.create_block_mask(causal, 1, 1, n, n, device=device, block_n=128)
    rows.append(("mask_mod causal, 128x128", square.visited_fraction,
                 lambda q, k, v: flashtile.attention(q, k, v, mask_mod=causal, block_mask=square), None, False))
    # A mask_mod given without a block mask: attention() builds one (once, cached) with its default
    # tiles (128 × 128 where the block-sparse Gluon forward takes them, else 128 × 64).
    rows.append(("mask_mod causal, by default", None, lambda q, k, v: flashtile.attention(q, k, v, mask_mod=causal),
                 None, False))
    for docs in args.docs:
        ids, mask, bm = causal_documents(n, docs, device)
        rows.append((f"document mask ({docs} docs)", bm.visited_fraction,
                     lambda q, k, v, mask=mask, bm=bm: flashtile.attention(q, k, v, mask_mod=mask, block_mask=bm),
                     ids, False))
    # flashtile's rows first, so that FlexAttention's compiles cannot cost them to a time limit.
    ours = timed_in_rounds([(name, fn, triton_only) for name, _, fn, _, triton_only in rows], q, k, v, args.rounds)
    base = ours["built-in causal"]
    print(f"N={n}, heads {heads}, headdim {d}, bf16, causal; fwd / bwd / step ms (bwd: alone, retain_graph; "
          f"step: fwd + torch.autograd.grad), medians of {args.rounds} rounds; 'tiles' = visited fraction of all tiles")
    print(f"{'':28s} {'tiles':>6} | {'flashtile':>27} | {'vs built-in':>21}")
    for name, tiles, _, _, _ in rows:
        if name not in ours:
            continue
        shown = "-" if tiles is None else f"{tiles:.3f}"
        print(f"{name:28s} {shown:>6} | {_three(ours[name], '7.2f')} | {_three(_over(ours[name], base), '5.2f')}",
              flush=True)
    if args.no_flex:
        return
    # (flex's default tiles are 128 × 128 already; the default row is the first one again)
    flex_rows = [(name, flex_fn(ids, True, batch, heads, n, device), False) for name, _, _, ids, _ in rows
                 if name in ours and not ("128x" in name or "default" in name or name.startswith("built-in"))]
    theirs = timed_in_rounds([row for row in flex_rows if row[1] is not None], q, k, v, args.rounds)
    print(f"{'FlexAttention, same mask':28s} {'':>6} | {'flex':>27} | "
          "flex time / flashtile time (> 1: flashtile faster)")
    for name, times in theirs.items():
        print(f"{name:28s} {'':>6} | {_three(times, '7.2f')} | {_three(_over(times, ours[name]), '5.2f')}",
              flush=True)


def timed_in_rounds(rows, q, k, v, rounds: int) -> dict:
    """{name: (fwd, bwd, step) ms, each the median of ``rounds`` rounds over every row in turn} of
    ``rows`` (name, fn, whether on the Triton kernels only). A row that raises (e.g. a tile shape
    whose backward does not fit) is reported once and left out."""
    times, failed = {name: [] for name, _, _ in rows}, set()
    for _ in range(rounds):
        for name, fn, triton_only in rows:
            if name in failed:
                continue
            try:
                with triton_kernels_only() if triton_only else contextlib.nullcontext():
                    times[name].append(time_fwd_bwd(fn, q, k, v))
            except Exception as e:  # noqa: BLE001 - one row's failure must not end the run
                failed.add(name)
                print(f"{name}: {type(e).__name__}: {str(e)[:100]}", flush=True)
    return {name: tuple(statistics.median(run[i] for run in runs) for i in range(3))
            for name, runs in times.items() if name not in failed}


if __name__ == "__main__":
    main()
