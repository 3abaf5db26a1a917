"""Decode bandwidth: K/V bytes read per second by flash_attn_with_kvcache, one query token.

bf16, headdim 128, GQA 32:8 and 64:8; batch × cache length over a grid. The copy
ceiling (a device-to-device copy, bytes read + written) is measured in the same run,
and SDPA's backends and FlexAttention (compiled) run the same problem (enable_gqa) where
they accept it.

    python benchmarks/decode.py --batches 32 128 --cache 8192 32768
    python benchmarks/decode.py --device cpu --batches 2 --cache 512 --heads 16 --no-flex   # smoke test
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from timing import median_ms

import flashtile


def copy_bandwidth(device) -> float:
    src = torch.empty(2 * 1024**3 if torch.device(device).type == "cuda" else 2**24, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = median_ms(lambda: dst.copy_(src), device)
    return 2 * src.numel() / (t * 1e-3) / 1e12  # TB/s, read + write


_flex = []


def flex_decode():
    """FlexAttention (compiled, GQA) for one query token, or None where torch lacks it."""
    if not _flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            compiled = torch.compile(flex_attention)
            _flex.append(lambda q, k, v: compiled(q, k, v, enable_gqa=True))
        except ImportError:
            _flex.append(None)
    return _flex[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    p.add_argument("--cache", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--heads", type=int, nargs="+", default=[32, 64])
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--programs-per-sm", type=int, default=None,
                   help="one split-KV target for every grid size, instead of the rule's two (kernels/decode_launch.py)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (meaningless numbers)")
    args = p.parse_args()
    if args.programs_per_sm is not None:
        from flashtile.kernels import decode_launch

        decode_launch.PROGRAMS_PER_SM = decode_launch.LARGE_GRID_PROGRAMS_PER_SM = args.programs_per_sm
        print(f"split-KV target: {args.programs_per_sm} programs per SM")
    ceiling = copy_bandwidth(args.device)
    print(f"copy ceiling: {ceiling:.2f} TB/s (read + write)")
    print(f"{'B':>4} {'cache':>6} {'Hq:Hkv':>7} | {'flashtile':>9} {'paged':>9} {'% copy':>7} "
          "| sdpa flash / eff / cudnn (TB/s)")
    shapes = [(heads_q, batch, cache) for heads_q in args.heads for batch in args.batches for cache in args.cache]
    for heads_q, batch, cache in shapes:
        q, k, v, lens = problem(batch, cache, heads_q, args.device)
        kv_bytes = 2 * k.numel() * k.element_size()
        # A long warm-up: the first row of an earlier run read low (clocks, caches).
        t = median_ms(lambda: flashtile.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens), args.device,
                      warmup=100, rep=50)
        page = 256
        k_paged, v_paged = k.view(-1, page, HEADS_KV, HEADDIM), v.view(-1, page, HEADS_KV, HEADDIM)
        table = torch.arange(batch * cache // page, dtype=torch.int32, device=args.device).view(batch, -1)
        t_paged = median_ms(lambda: flashtile.flash_attn_with_kvcache(q, k_paged, v_paged, cache_seqlens=lens,
                                                                     block_table=table),
                            args.device, warmup=100, rep=50)
        tb = kv_bytes / (t * 1e-3) / 1e12
        tb_paged = kv_bytes / (t_paged * 1e-3) / 1e12
        sdpa = []
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
                    fn()
                    t_sdpa = median_ms(fn, args.device, warmup=5, rep=30)
                    sdpa.append(f"{kv_bytes / (t_sdpa * 1e-3) / 1e12:.2f}")
            except RuntimeError:
                sdpa.append("n/a")
        print(f"{batch:>4} {cache:>6} {heads_q:>4}:{HEADS_KV:<2} | {tb:9.2f} {tb_paged:9.2f} "
              f"{100 * max(tb, tb_paged) / ceiling:6.1f}% | {' / '.join(sdpa)}", flush=True)
    flex = None if args.no_flex else flex_decode()
    if flex is None:
        return
    # FlexAttention after every flashtile row: its compiles cannot cost those rows to a time limit.
    print("FlexAttention decoding (compiled), TB/s of K/V read:")
    for heads_q, batch, cache in shapes:
        q, k, v, _ = problem(batch, cache, heads_q, args.device)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        try:
            flex(qt, kt, vt)
            t_flex = median_ms(lambda: flex(qt, kt, vt), args.device, warmup=100, rep=50)
            shown = f"{2 * k.numel() * k.element_size() / (t_flex * 1e-3) / 1e12:.2f}"
        except Exception as e:  # noqa: BLE001 - a baseline's failure must not end the run
            shown = f"error ({type(e).__name__})"
        print(f"{batch:>4} {cache:>6} {heads_q:>4}:{HEADS_KV:<2} | {shown}", flush=True)


HEADS_KV, HEADDIM = 8, 128


def problem(batch: int, cache: int, heads_q: int, device):
    """q (B, 1, Hq, D), a full K/V cache (B, cache, Hkv, D) in bf16, and its lengths."""
    q = torch.randn(batch, 1, heads_q, HEADDIM, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch, cache, HEADS_KV, HEADDIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((batch,), cache, dtype=torch.int32, device=device)
    return q, k, v, lens


if __name__ == "__main__":
    main()
