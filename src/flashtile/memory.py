"""Peak extra memory of a block of code, on CUDA and on the CPU.

On CUDA this is the caching allocator's peak. PyTorch keeps no such statistic for
CPU tensors, so there a dispatch mode adds up the bytes of every storage that an
operation creates and subtracts them when the storage is freed. Both count only
memory allocated inside the block (the inputs are not included).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class PeakMemory:
    peak_bytes: int = 0

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


class _StorageCounter(TorchDispatchMode):
    """Counts live bytes of storages created by the operations it sees."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "flashtile":
            # A custom op would hide its inner allocations from this mode: run its
            # CPU implementation with the mode still active.
            with self:
                out = func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        else:
            out = func(*args, **kwargs)
        # A view (or in-place result) of an argument allocates nothing new.
        input_storages = {id(a.untyped_storage()) for a in tree_flatten((args, kwargs))[0]
                          if isinstance(a, torch.Tensor) and a.device.type == "cpu"}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            key, nbytes = id(storage), storage.nbytes()
            if key in self._seen or key in input_storages or nbytes == 0:
                continue
            self._seen.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


@contextmanager
def track_peak_memory(device: torch.device | str):
    """``with track_peak_memory(dev) as m: ...`` then ``m.peak_bytes``: extra bytes at the peak."""
    device = torch.device(device)
    result = PeakMemory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            yield result
        finally:
            torch.cuda.synchronize(device)
            result.peak_bytes = torch.cuda.max_memory_allocated(device) - base
    else:
        counter = _StorageCounter()
        try:
            with counter:
                yield result
        finally:
            result.peak_bytes = counter.peak
