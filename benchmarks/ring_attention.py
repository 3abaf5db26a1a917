"""Ring attention on several GPUs: per-GPU throughput against the single-GPU kernel, and
the same ring schedule with the communication removed (how much of it is hidden).

Launch one process per GPU (NCCL_NVLS_ENABLE=0 must stay set on this workplace's machines):

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/ring_attention.py

Defaults are issue 8's target: bf16, batch 1, heads 16, headdim 128, causal, zigzag
sharding, N = 131072 tokens in total (65536 per GPU on two H200s). Rows, per GPU:

    single-GPU kernel    flashtile.attention, causal, on one GPU's shard length (N / W)
    ring                 ring_attention over all W GPUs, N tokens
    ring, no comm        the ring's exact schedule (same calls, same masks, same merges),
                         each "received" block being the rank's own: compute only

TFLOP/s counts the causal work of the whole sequence divided by W (4·N²·H·D / 2 forward,
2.5 × that backward); efficiency = ring TFLOP/s / single-GPU TFLOP/s. Times are the
slowest rank's mean over --iters iterations. Results go to --out as JSON (rank 0).
--trace DIR writes a torch.profiler Chrome trace per rank for one ring forward+backward:
the NCCL SendRecv kernels should run beside the attention kernels, not between them.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import flashtile
from flashtile.distributed import ring_attention, unshard, zigzag_shard
from flashtile.distributed.comm import LocalRing
from flashtile.distributed.ring import ring_backward, ring_config, ring_forward


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlen", type=int, default=131072, help="total tokens N over all ranks")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--sharding", default="zigzag", choices=["zigzag", "contiguous"])
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--check-seqlen", type=int, default=8192,
                   help="first check ring vs single-GPU attention at this N (0 = skip)")
    p.add_argument("--out", default=None, help="JSON file for the results (rank 0)")
    p.add_argument("--trace", default=None, help="directory for per-rank Chrome traces")
    return p.parse_args()


def flops_fwd(batch, seqlen, heads, headdim, causal) -> float:
    return 4.0 * batch * seqlen * seqlen * heads * headdim / (2.0 if causal else 1.0)


def timed(fn, warmup: int, iters: int) -> float:
    """Mean seconds per call on this rank, ranks started together; then the slowest rank's."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    mine = torch.tensor([start.elapsed_time(end) / 1e3 / iters], device="cuda")
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def shards(args, seqlen, generator_seed=0):
    """This rank's q, k, v, dout shards of one random full sequence (same on every rank)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator(device="cuda").manual_seed(generator_seed)
    full = [torch.randn(args.batch, seqlen, args.heads, args.headdim, device="cuda", dtype=torch.bfloat16,
                        generator=g) for _ in range(4)]
    local = [(zigzag_shard(t, 1, world, rank) if args.sharding == "zigzag" else t.chunk(world, 1)[rank]).contiguous()
             for t in full]
    return full, local


def check(args):
    """Ring output against single-GPU flashtile.attention on the gathered sequence (max abs error)."""
    world = dist.get_world_size()
    full, (q, k, v, _) = shards(args, args.check_seqlen, generator_seed=1)
    out = ring_attention(q, k, v, causal=args.causal, sharding=args.sharding)
    parts = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(parts, out)
    gathered = unshard(parts, 1, world, args.sharding)
    single = flashtile.attention(*full[:3], causal=args.causal)
    return float((gathered.float() - single.float()).abs().max())


def main():
    args = parse_args()
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        raise SystemExit("set NCCL_NVLS_ENABLE=0 (required on this workplace's machines)")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    results = {"world_size": world, "device": torch.cuda.get_device_name(), **vars(args)}

    if args.check_seqlen:
        results["check_max_abs_error"] = check(args)

    full_len = args.seqlen
    local_len = full_len // world
    _, (q, k, v, dout) = shards(args, full_len)
    for t in (q, k, v):
        t.requires_grad_()
    cfg = ring_config(q, k, v, causal=args.causal, softmax_scale=None, window_size=(-1, -1), layout="bshd",
                      sharding=args.sharding, softcap=0.0, world_size=world)
    local = LocalRing(world, rank)
    f_fwd = flops_fwd(args.batch, full_len, args.heads, args.headdim, args.causal) / world
    f_single = flops_fwd(args.batch, local_len, args.heads, args.headdim, args.causal)

    def ring_fwd():
        with torch.no_grad():
            ring_attention(q, k, v, causal=args.causal, sharding=args.sharding)

    out, lse = ring_attention(q, k, v, causal=args.causal, sharding=args.sharding, return_lse=True)

    def ring_bwd():
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    def nocomm_fwd():
        ring_forward(q.detach(), k.detach(), v.detach(), cfg, local)

    def nocomm_bwd():
        ring_backward(dout, None, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), cfg, local)

    # The single-GPU kernel at one GPU's shard length (every rank runs it; the slowest counts).
    sq, sk, sv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    s_out = flashtile.attention(sq, sk, sv, causal=args.causal)

    def single_fwd():
        with torch.no_grad():
            flashtile.attention(sq, sk, sv, causal=args.causal)

    def single_bwd():
        torch.autograd.grad(s_out, (sq, sk, sv), dout, retain_graph=True)

    rows = {}
    for name, fwd, bwd, flops in (
        ("single-GPU kernel", single_fwd, single_bwd, f_single),
        ("ring", ring_fwd, ring_bwd, f_fwd),
        ("ring, no comm", nocomm_fwd, nocomm_bwd, f_fwd),
    ):
        t_fwd = timed(fwd, args.warmup, args.iters)
        t_bwd = timed(bwd, args.warmup, args.iters)
        rows[name] = {"fwd_ms": t_fwd * 1e3, "bwd_ms": t_bwd * 1e3,
                      "fwd_tflops": flops / t_fwd / 1e12, "bwd_tflops": 2.5 * flops / t_bwd / 1e12}
    for phase in ("fwd", "bwd"):
        single = rows["single-GPU kernel"][f"{phase}_tflops"]
        rows["ring"][f"{phase}_efficiency"] = rows["ring"][f"{phase}_tflops"] / single
        rows["ring"][f"{phase}_comm_overhead"] = 1 - rows["ring, no comm"][f"{phase}_ms"] / rows["ring"][f"{phase}_ms"]
    results["rows"] = rows

    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            o = ring_attention(q, k, v, causal=args.causal, sharding=args.sharding)
            o.backward(dout)
            torch.cuda.synchronize()
        prof.export_chrome_trace(os.path.join(args.trace, f"ring-rank{rank}.json"))

    if rank == 0:
        print(f"{world} × {results['device']}: N={full_len} ({local_len} per GPU), heads {args.heads}, "
              f"headdim {args.headdim}, bf16, {'causal' if args.causal else 'full'}, {args.sharding}")
        if "check_max_abs_error" in results:
            print(f"check at N={args.check_seqlen}: max |ring − single-GPU| = {results['check_max_abs_error']:.2e}")
        print(f"{'':20s} {'fwd ms':>9s} {'TFLOP/s':>8s} {'bwd ms':>9s} {'TFLOP/s':>8s}")
        for name, r in rows.items():
            print(f"{name:20s} {r['fwd_ms']:9.2f} {r['fwd_tflops']:8.1f} {r['bwd_ms']:9.2f} {r['bwd_tflops']:8.1f}")
        r = rows["ring"]
        print(f"per-GPU efficiency vs single-GPU kernel: fwd {r['fwd_efficiency']:.1%}, bwd {r['bwd_efficiency']:.1%}; "
              f"time not hidden by compute: fwd {r['fwd_comm_overhead']:.1%}, bwd {r['bwd_comm_overhead']:.1%}")
        if args.out:
            results["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
            with open(args.out, "w") as f:
                json.dump(results, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
