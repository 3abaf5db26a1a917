"""Context parallelism: one long sequence across the ranks of a torch.distributed group.

- :func:`ring_attention`: K/V blocks travel around a ring of P2P sends, overlapped
  with the local attention; outputs merge by LSE. Any heads count; memory per rank
  O(N/W).
- :func:`ulysses_attention`: two all-to-alls swap the sequence shard for a head shard,
  so each rank runs ordinary attention on heads/W heads of the whole sequence.
- :func:`shard` / :func:`unshard` / :func:`position_ids` (and the ``zigzag_*`` forms):
  cut a sequence into the layout both expect, rejoin it, and give rotary its positions.

docs/distributed.md says when each pays and how to launch across nodes.
"""

from .ring import ring_attention
from .sharding import (
    SHARDINGS,
    position_ids,
    shard,
    unshard,
    zigzag_position_ids,
    zigzag_shard,
    zigzag_unshard,
)
from .ulysses import ulysses_attention

__all__ = [
    "ring_attention",
    "ulysses_attention",
    "shard",
    "unshard",
    "position_ids",
    "zigzag_shard",
    "zigzag_unshard",
    "zigzag_position_ids",
    "SHARDINGS",
]
