"""Ring attention: context parallelism over the sequence, exact, forward and backward.

Each of the W ranks of a process group holds a shard of one long sequence: its
queries Q_r and the keys and values K_r, V_r of the same tokens (layout in
:mod:`.sharding`). The K/V blocks travel around the ring, one hop per step::

    step t, rank r:  holds K/V of rank s = (r − t) mod W
                     post: send it to r+1, receive the next from r−1   (overlapped)
                     compute: attention of Q_r over K_s, V_s → (O_t, LSE_t)
                     merge:   (O, LSE) ← merge(O, LSE, O_t, LSE_t)      (by LSE)
                     wait for the next block

After W steps every query has seen every key, and (O, LSE) is exactly the
single-process result. The masks of each (Q_r, K_s) block are bands in local
coordinates (:mod:`.plan`), so the one attention op does every block.

The backward runs the same ring. For each block it calls the attention backward op
with the *global* O and LSE: with P = exp(S − LSE) the block's share of the
softmax, and D = rowsum(dO ∘ O) the global one, dS = P ∘ (dP − D) is the block's
part of the exact gradient, so nothing needs rescaling. dQ accumulates locally;
dK and dV of block s accumulate in a float32 buffer that travels with it and,
after the last step, one more hop brings it home to rank s::

    step t, rank r:  post: send K/V of s on, receive the next
                     compute: dQ_r += dQ_t;  dKV_t = this rank's share of dK_s, dV_s
                     wait for the accumulator of s (from r−1), add dKV_t, send it to r+1

The accumulator's transfer overlaps the next step's compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from .. import ops
from ..backends import select_backend, tf32_allowed
from ..masks import Band, normalize_window
from ..merge import merge_attention_states_pair
from ..validation import check_backend_limits, check_options, check_qkv, last_dim_contiguous
from .comm import LocalRing, RingComm
from .plan import BlockCall, plan_block
from .sharding import check_sharding, shard_segments

_KV_TAG, _DKV_TAG = 0, 1  # gloo matches messages by tag; K/V and dK/dV shifts overlap in the backward

Comm = Union[RingComm, LocalRing]


@dataclass(frozen=True)
class RingConfig:
    """Everything about a ring call but the tensors and the transport."""

    layout: str  # "bshd" or "bhsd"
    softmax_scale: float
    band: Band  # the global band (None = unbounded)
    softcap: float
    backend: str
    allow_tf32: bool
    sharding: str

    @property
    def seq_dim(self) -> int:
        return 1 if self.layout == "bshd" else 2


_LSE_SEQ_DIM = 2  # the LSE is (batch, heads, seqlen) in either layout


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _calls(cfg: RingConfig, comm: Comm, src: int, local_len: int) -> tuple[BlockCall, ...]:
    mine = shard_segments(cfg.sharding, comm.world_size, comm.rank, local_len)
    theirs = shard_segments(cfg.sharding, comm.world_size, src, local_len)
    return plan_block(mine, theirs, cfg.band)


def _rows(t: Tensor, dim: int, lo: int, hi: int) -> Tensor:
    return t.narrow(dim, lo, hi - lo)


def _op_options(cfg: RingConfig, call: BlockCall) -> dict:
    """The attention ops' options for one block call, by name (the ops may grow defaulted options)."""
    return dict(layout=cfg.layout, softmax_scale=cfg.softmax_scale, window_left=call.window_left,
                window_right=call.window_right, softcap=cfg.softcap, alibi_slopes=None, backend=cfg.backend,
                allow_tf32=cfg.allow_tf32, bias=None, dropout_p=0.0, dropout_seed=None, cu_seqlens_q=None,
                cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0)


def ring_forward(q: Tensor, k: Tensor, v: Tensor, cfg: RingConfig, comm: Comm) -> tuple[Tensor, Tensor]:
    """Returns out (q's shape, dtype and layout) and the LSE (float32, (batch, heads_q, seqlen_local))."""
    sd, world = cfg.seq_dim, comm.world_size
    local_len = q.shape[sd]
    kv = torch.stack([k, v])  # (2, *k.shape): one contiguous buffer per hop
    acc = _acc_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse_shape = (q.shape[0], q.shape[2 if cfg.layout == "bshd" else 1], local_len)
    lse = torch.full(lse_shape, float("-inf"), dtype=acc, device=q.device)
    for step in range(world):
        incoming = comm.shift(kv, _KV_TAG) if step + 1 < world else None
        src = (comm.rank - step) % world
        for c in _calls(cfg, comm, src, local_len):
            o_c, lse_c = ops.attention_forward(
                _rows(q, sd, c.q_lo, c.q_hi), _rows(kv[0], sd, c.k_lo, c.k_hi), _rows(kv[1], sd, c.k_lo, c.k_hi),
                **_op_options(cfg, c),
            )
            out_rows, lse_rows = _rows(out, sd, c.q_lo, c.q_hi), _rows(lse, _LSE_SEQ_DIM, c.q_lo, c.q_hi)
            merged_out, merged_lse = merge_attention_states_pair(out_rows, lse_rows, o_c.to(acc), lse_c.to(acc),
                                                                 layout=cfg.layout)
            out_rows.copy_(merged_out)
            lse_rows.copy_(merged_lse)
        if incoming is not None:
            kv = incoming.wait()
    return out.to(q.dtype), lse


def ring_backward(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  cfg: RingConfig, comm: Comm) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the local q, k, v shards, from the global (merged) out and LSE."""
    sd, world = cfg.seq_dim, comm.world_size
    local_len = q.shape[sd]
    acc = _acc_dtype(q.dtype)
    kv = torch.stack([k, v])
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dkv_home: Optional[Tensor] = None  # dK, dV of the block held this step, summed over the ranks so far
    home_shift = None  # the accumulators' hop posted at the previous step
    for step in range(world):
        incoming = comm.shift(kv, _KV_TAG) if step + 1 < world else None
        src = (comm.rank - step) % world
        dkv = None  # this rank's share of block src's dK, dV
        for c in _calls(cfg, comm, src, local_len):
            qs = (sd, c.q_lo, c.q_hi)
            ks = (sd, c.k_lo, c.k_hi)
            # The global out and LSE: P = exp(S − LSE) is this block's share of the whole softmax.
            dq_c, dk_c, dv_c, _ = ops.attention_backward(
                _rows(dout, *qs), None if dlse is None else _rows(dlse, _LSE_SEQ_DIM, c.q_lo, c.q_hi),
                _rows(q, *qs), _rows(kv[0], *ks), _rows(kv[1], *ks), _rows(out, *qs),
                _rows(lse, _LSE_SEQ_DIM, c.q_lo, c.q_hi), **_op_options(cfg, c), bias_requires_grad=False,
            )
            if dkv is None:
                dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)
            _rows(dq, *qs).add_(dq_c)
            _rows(dkv[0], *ks).add_(dk_c)
            _rows(dkv[1], *ks).add_(dv_c)
        # Block src's accumulator: the shares of ranks src … r−1 (arriving from r−1), plus this rank's.
        if home_shift is None:  # step 0: the block is this rank's own
            dkv_home = dkv if dkv is not None else torch.zeros(kv.shape, dtype=acc, device=kv.device)
        else:
            dkv_home = home_shift.wait()
            if dkv is not None:
                dkv_home.add_(dkv)
        if world > 1:  # on to r+1; after the last step that is the block's owner
            home_shift = comm.shift(dkv_home, _DKV_TAG)
        if incoming is not None:
            kv = incoming.wait()
    if home_shift is not None:
        dkv_home = home_shift.wait()  # this rank's own dK, dV, home from the last rank of the ring
    return dq.to(q.dtype), dkv_home[0].to(k.dtype), dkv_home[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cfg: RingConfig, comm: Comm):
        out, lse = ring_forward(q, k, v, cfg, comm)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg, ctx.comm = cfg, comm
        ctx.set_materialize_grads(False)  # dlse stays None unless the LSE is used
        return out, lse

    @staticmethod
    def backward(ctx, dout: Optional[Tensor], dlse: Optional[Tensor]):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        elif dout.stride(-1) != 1:
            dout = dout.contiguous()
        dq, dk, dv = ring_backward(dout, dlse, q, k, v, out, lse, ctx.cfg, ctx.comm)
        return dq, dk, dv, None, None


def ring_config(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, softmax_scale, window_size, layout: str,
                sharding: str, softcap: float, world_size: int) -> RingConfig:
    """Check the arguments of a ring call (each error names the argument) and resolve the options."""
    batch, seqlen_q, seqlen_k, heads_q, _, headdim = check_qkv(q, k, v, layout)
    softmax_scale = check_options(
        headdim=headdim, batch=batch, heads_q=heads_q, device=q.device, softmax_scale=softmax_scale,
        window_size=window_size, softcap=softcap, alibi_slopes=None, dropout_p=0.0,
    )
    check_sharding(sharding)
    if seqlen_q != seqlen_k:
        raise ValueError(f"k: expected the local seqlen of q ({seqlen_q}): each rank holds the queries, keys and "
                         f"values of the same tokens; got {seqlen_k}")
    shard_segments(sharding, world_size, 0, seqlen_q)  # zigzag: the local length must be even
    backend = select_backend(q.device, q.dtype)
    check_backend_limits(backend, q.dtype, headdim)
    return RingConfig(layout, softmax_scale, normalize_window(causal, window_size), float(softcap), backend,
                      tf32_allowed(q.dtype), sharding)


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: Optional[dist.ProcessGroup] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window_size: tuple[int, int] = (-1, -1),
    layout: str = "bshd",
    *,
    sharding: str = "zigzag",
    softcap: float = 0.0,
    return_lse: bool = False,
):
    """Exact attention over a sequence sharded across the ranks of ``group``, K/V passed around a ring.

    Call it on every rank of the group with that rank's shard (same shapes on every rank).

    Args:
        q: this rank's queries, (batch, seqlen_local, heads_q, headdim) for ``layout="bshd"``
            or (batch, heads_q, seqlen_local, headdim) for ``"bhsd"``; float16, bfloat16,
            float32 (float64 on the reference backend).
        k, v: the keys and values of the same tokens, heads_kv heads (heads_q % heads_kv == 0).
        group: the process group to shard over (default: the world). NCCL for CUDA
            tensors, gloo for CPU tensors.
        causal, window_size: the mask over *global* positions (the full sequence of
            N = world_size · seqlen_local tokens), as :func:`flashtile.attention` would
            apply it to the unsharded sequence. window_size = (left, right), −1 = unbounded.
        softmax_scale: defaults to 1/sqrt(headdim).
        sharding: how the sequence is cut: "zigzag" (rank r holds chunks r and 2W−1−r of
            2W equal chunks: balanced under a causal mask; seqlen_local must be even) or
            "contiguous" (rank r holds the r-th of W pieces). Cut inputs with
            :func:`flashtile.distributed.shard` (or :func:`zigzag_shard`) and give rotary
            embeddings :func:`position_ids`.
        softcap: > 0 caps scores as ``softcap * tanh(s / softcap)``.
        return_lse: also return the LSE over all keys, float32 (batch, heads_q, seqlen_local).

    Returns:
        out, this rank's shard of the output, in q's shape, layout and dtype; and
        ``(out, lse)`` with ``return_lse``. Differentiable in q, k, v (and through the LSE).
    """
    comm = RingComm(group)
    cfg = ring_config(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, layout=layout,
                      sharding=sharding, softcap=softcap, world_size=comm.world_size)
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    out, lse = _RingAttention.apply(q, k, v, cfg, comm)
    return (out, lse) if return_lse else out
