"""Ulysses (head-parallel) attention: trade the sequence shard for a head shard, twice.

Each of the W ranks holds a sequence shard of every head. One all-to-all regroups
the tensors so that each rank holds the *whole* sequence of H/W heads; every rank
then runs ordinary single-device attention on its heads (any mask, no ring, no
merging), and a second all-to-all brings the output back to sequence shards::

    q, k, v  (B, N/W, H, D)  --all-to-all-->  (B, N, H/W, D)  --attention-->
    out      (B, N, H/W, D)  --all-to-all-->  (B, N/W, H, D)

The backward is the same three steps reversed (the gradient of an all-to-all is the
reverse all-to-all). Per layer each rank sends about 4 · (W−1)/W of its q/k/v/out
shards, independent of W's effect on compute; it needs heads_q and heads_kv
divisible by W.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ..api import attention
from ..validation import check_qkv
from .comm import AllToAll, group_or_world
from .sharding import check_sharding, shard, unshard


def _to_heads(x: Tensor, seq_dim: int, head_dim: int, group, world_size: int, sharding: str) -> Tensor:
    """Sequence shard of all heads -> all of the sequence (global order) for this rank's heads."""
    x = AllToAll.apply(x, head_dim, seq_dim, group)  # sequence concatenated in rank order
    # Contiguous shards in rank order are the global order; zigzag ones need their chunks put back.
    return unshard(x, seq_dim, world_size, sharding) if sharding == "zigzag" else x


def _to_sequence(x: Tensor, seq_dim: int, head_dim: int, group, world_size: int, sharding: str) -> Tensor:
    """The inverse of :func:`_to_heads`."""
    if sharding == "zigzag":
        x = torch.cat([shard(x, seq_dim, world_size, r, sharding) for r in range(world_size)], seq_dim)
    return AllToAll.apply(x, seq_dim, head_dim, group)


def ulysses_attention(
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
    alibi_slopes: Optional[Tensor] = None,
    return_lse: bool = False,
):
    """Exact attention over a sequence sharded across ``group``, computed head-parallel (all-to-all).

    Same call as :func:`flashtile.distributed.ring_attention`: every rank passes its
    shard, (batch, seqlen_local, heads, headdim) for ``layout="bshd"`` or
    (batch, heads, seqlen_local, headdim) for ``"bhsd"``, cut with the same
    ``sharding`` ("zigzag" or "contiguous"); masks apply to global positions.
    heads_q and heads_kv must both divide by the group's size. ``alibi_slopes``
    (float32 (heads_q,) or (batch, heads_q), the full set on every rank) is
    supported here, since each rank sees whole rows. k and v may have a different
    local seqlen than q (cross-attention; causal stays bottom-right aligned globally).

    Returns out (q's shape, layout and dtype), and with ``return_lse`` the LSE,
    float32 (batch, heads_q, seqlen_local). Differentiable in q, k, v (and through the LSE).
    """
    group = group_or_world(group)
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    _, seqlen_q, seqlen_k, heads_q, heads_kv, _ = check_qkv(q, k, v, layout)
    check_sharding(sharding)
    for name, heads in (("q", heads_q), ("k", heads_kv)):
        if heads % world_size:
            raise ValueError(f"{name}: Ulysses attention splits heads across the {world_size} ranks of the group; "
                             f"{heads} heads do not divide by {world_size} (use ring_attention)")
    pieces = 2 if sharding == "zigzag" else 1
    for name, n in (("q", seqlen_q), ("k", seqlen_k)):
        if n % pieces:
            raise ValueError(f"{name}: zigzag sharding needs an even local seqlen, got {n}")
    seq_dim, head_dim = (1, 2) if layout == "bshd" else (2, 1)
    local_heads = heads_q // world_size
    slopes = None
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor) or alibi_slopes.shape[-1] != heads_q:
            raise ValueError(f"alibi_slopes: expected shape ({heads_q},) or (batch, {heads_q}), got "
                             f"{getattr(alibi_slopes, 'shape', type(alibi_slopes).__name__)}")
        slopes = alibi_slopes[..., rank * local_heads:(rank + 1) * local_heads].contiguous()

    q_h, k_h, v_h = (_to_heads(t, seq_dim, head_dim, group, world_size, sharding) for t in (q, k, v))
    out_h, lse_h = attention(q_h, k_h, v_h, causal=causal, window_size=window_size, softmax_scale=softmax_scale,
                             softcap=softcap, alibi_slopes=slopes, return_lse=True, layout=layout)
    out = _to_sequence(out_h, seq_dim, head_dim, group, world_size, sharding)
    if not return_lse:
        return out
    lse = _to_sequence(lse_h, 2, 1, group, world_size, sharding)  # (batch, heads, seqlen) in either layout
    return out, lse
