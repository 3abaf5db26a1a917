"""The two transports, both on torch.distributed: ring shifts (P2P) and all-to-all.

Nothing here assumes the ranks share a host: peers are addressed by their global
rank in the process group and every byte goes through the group's backend (NCCL
for CUDA tensors, gloo for CPU tensors), so one node or many is the same code.

``RingComm.shift`` posts a batched isend to the next rank and irecv from the
previous one and returns at once; the caller computes on the block it holds while
the next one travels, then waits. On NCCL the transfer runs on NCCL's own stream:
it starts after the work already queued on the current stream, and ``wait()`` makes
the current stream wait for it, so the kernel launched in between overlaps it.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor


def group_or_world(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group "
                           "(e.g. under torchrun) before flashtile.distributed")
    return dist.group.WORLD if group is None else group


class PendingShift:
    """A block in flight; ``wait()`` returns it once it has arrived."""

    def __init__(self, received: Tensor, sent: Tensor, works: list):
        self._received, self._sent, self._works = received, sent, works

    def wait(self) -> Tensor:
        for work in self._works:
            work.wait()
        self._sent = None  # the send buffer may be reused from here on
        return self._received


class RingComm:
    """Shifts tensors one step around the ranks of ``group``: rank r sends to r+1, receives from r−1."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group_or_world(group)
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("group: this process is not a member of the group it was given")
        self._next = dist.get_global_rank(self.group, (self.rank + 1) % self.world_size)
        self._prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world_size)

    def shift(self, tensor: Tensor, tag: int = 0) -> PendingShift:
        """Send ``tensor`` (contiguous) to the next rank; receive the previous rank's into a new buffer.

        ``tag`` keeps two streams of blocks apart on backends that match by tag (gloo);
        every rank posts its shifts in the same order, which is what NCCL relies on.
        """
        received = torch.empty_like(tensor)
        ops = [
            dist.P2POp(dist.isend, tensor, self._next, self.group, tag),
            dist.P2POp(dist.irecv, received, self._prev, self.group, tag),
        ]
        return PendingShift(received, tensor, dist.batch_isend_irecv(ops))


class LocalRing:
    """The ring's schedule with the communication removed, for timing: every "received"
    block is the rank's own. Results are wrong for world_size > 1; only the compute is real.
    """

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.rank = world_size, rank

    def shift(self, tensor: Tensor, tag: int = 0) -> PendingShift:
        return PendingShift(tensor, tensor, [])


def all_to_all(x: Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> Tensor:
    """Split ``x`` into world_size parts along ``scatter_dim``, send part j to rank j, and
    concatenate the parts received (in rank order) along ``gather_dim``. Not differentiable;
    see :class:`AllToAll`.
    """
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return x
    send = torch.stack(x.tensor_split(world_size, scatter_dim)).contiguous()  # (W, *part)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), gather_dim)


class AllToAll(torch.autograd.Function):
    """Differentiable :func:`all_to_all`: the gradient goes back by the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x: Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup) -> Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None
