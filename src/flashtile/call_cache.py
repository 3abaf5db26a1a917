"""What ``attention``'s checks made of a plain call, remembered by everything they read.

A call's checks (shapes, dtypes, devices, the options, the backend, the band) are a function
of its tensors' metadata, its options and a few switches, never of the tensors' values. A
training or inference loop repeats the same few calls, so the second call of a kind looks its
checked arguments up here instead of working them out again: ~10 of the 58 µs of Python a
stubbed d128 forward with grad took on a fast CPU (session 23, ``gluon_host_cpu.py --layers``), and
the H200's host runs the same Python ~3x slower, next to causal 1k kernels of ~170 µs.

Only plain calls are kept: no bias, ALiBi, dropout, mask_mod, block_mask or score_mod (those
hold tensors or objects whose checks depend on more than a key can say), q, k and v of exactly
``torch.Tensor`` (a subclass may answer ``.shape`` otherwise each time), ``causal`` a bool and
``window_size`` a tuple. Each other option goes into the key with its type: ``softmax_scale=True``
must not find the entry of ``softmax_scale=1``, since the checks reject the first. A call whose
checks fail raises before anything is kept, and calls that could be answered differently by state
the key does not hold (a sliding window that may run as a block mask, which depends on the Gluon
switches and on CUDA-graph capture) are not kept either. A call that is not kept pays for its key
and a lookup (~4 µs on a fast CPU) on top of its checks.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import torch
from torch import Tensor

_MAX_ENTRIES = 256  # distinct (shape, options) kinds; a process with more starts over


class CheckedCall(NamedTuple):
    """The arguments ``ops.attention`` takes for a plain call, besides q, k, v and the per-call
    ``allow_tf32``: the resolved softmax scale, the band's sides (None: unbounded), the softcap as
    a float, the backend, and whether q, k or v must be copied for a strided last dim."""

    softmax_scale: float
    window_left: Optional[int]
    window_right: Optional[int]
    softcap: float
    backend: str
    copies_needed: bool


_CHECKED: dict = {}


def plain_key(q, k, v, layout, causal, window_size, softmax_scale, softcap, dropout_p, deterministic) -> tuple | None:
    """The key of a call whose other arguments (bias, ALiBi, masks, score_mod, dropout seed) are
    all None, or None when it is not a plain call of kinds a key can stand for."""
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor:
        return None
    # causal only as a bool: the checks read it by its truth, which a tensor or an array given as causal
    # can change after a call (and which may not hash)
    if type(causal) is not bool or type(window_size) is not tuple or len(window_size) != 2:
        return None
    if type(dropout_p) not in (float, int) or dropout_p != 0:  # (a tensor's != would be a tensor)
        return None
    left, right = window_size
    return (
        q.shape, q.stride(), q.dtype, q.device, q.requires_grad,
        k.shape, k.stride(), k.dtype, k.device, k.requires_grad,
        v.shape, v.stride(), v.dtype, v.device, v.requires_grad,
        layout, causal, left, type(left), right, type(right), softmax_scale, type(softmax_scale),
        softcap, type(softcap), deterministic, type(deterministic), torch.is_grad_enabled(),
        # what select_backend reads (TRITON_INTERPRET only for tensors off the GPU: ~0.7 µs a read)
        os.environ.get("FLASHTILE_BACKEND"), None if q.is_cuda else os.environ.get("TRITON_INTERPRET"),
    )


def lookup(key: tuple | None) -> CheckedCall | None:
    """The checked call of ``key``, or None (no key, not seen, or a key of unhashable options:
    those take the checks, which name what is wrong)."""
    if key is None or torch.compiler.is_compiling():
        return None
    try:
        return _CHECKED.get(key)
    except TypeError:  # e.g. softmax_scale given as a list
        return None


def remember(key: tuple | None, checked: CheckedCall) -> None:
    """Keep ``checked`` for ``key`` (a call that passed every check)."""
    if key is None or torch.compiler.is_compiling():
        return
    if len(_CHECKED) >= _MAX_ENTRIES:
        _CHECKED.clear()
    try:
        _CHECKED[key] = checked
    except TypeError:  # an option the checks accept that does not hash: checked again next time
        pass


def clear() -> None:
    """Forget every checked call (tests that change what the checks read by other means)."""
    _CHECKED.clear()
