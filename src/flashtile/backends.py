"""Which implementation runs a call: the Triton kernels or the PyTorch reference.

``FLASHTILE_BACKEND=auto|triton|reference`` (read at each call, default ``auto``):
``auto`` picks ``triton`` for CUDA tensors when Triton is importable and
``reference`` otherwise. ``triton`` on CPU tensors runs Triton's interpreter, which
needs ``TRITON_INTERPRET=1`` in the environment before flashtile's kernels are first
used. Nothing here touches a GPU driver at import time.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

BACKENDS = ("auto", "triton", "reference")

# Looked up once, without importing Triton: a lookup inside a call would be a graph
# break under torch.compile (Dynamo does not trace importlib).
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


@dataclass(frozen=True)
class BackendStatus:
    name: str
    available: bool
    reason: str


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def cuda_index(device: torch.device) -> int:
    """The index of a CUDA device; "cuda" without one means the current device."""
    return device.index if device.index is not None else torch.cuda.current_device()


def compute_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device, asked of the driver once per device: torch's query
    costs microseconds, and the launch path asks it for every tensor it hands to TMA."""
    return _capability(cuda_index(device))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of a CUDA device, asked once per device (the decode split
    and the fused backward's tail split size their grids by it)."""
    return _sm_count(cuda_index(device))


def interpreting() -> bool:
    """Whether TRITON_INTERPRET asks for Triton's interpreter (kernels on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# The answer for CUDA tensors, made once: every call asks (select_backend), and building a
# frozen dataclass costs more than the rest of the question.
_CUDA_PRESENT = BackendStatus("triton", True, "CUDA GPU present")


def triton_status(device: torch.device | None = None) -> BackendStatus:
    """Whether the Triton kernels can run on ``device`` (default: any CUDA GPU)."""
    if not _TRITON_INSTALLED:
        return BackendStatus("triton", False, "the 'triton' package is not installed")
    if device is not None and device.type == "cuda":
        return _CUDA_PRESENT
    if device is not None and device.type == "cpu" or device is None and not torch.cuda.is_available():
        if interpreting():
            return BackendStatus("triton", True, "CPU tensors run in Triton's interpreter (TRITON_INTERPRET=1)")
        return BackendStatus(
            "triton", False, "no CUDA GPU for these tensors (set TRITON_INTERPRET=1 to run the kernels on the CPU)"
        )
    if device is not None and device.type != "cuda":
        return BackendStatus("triton", False, f"Triton kernels need CUDA tensors, got device {device.type!r}")
    return _CUDA_PRESENT


def backend_status() -> list[BackendStatus]:
    """The state of every backend on this machine, with the reason when unavailable."""
    return [
        triton_status(),
        BackendStatus("reference", True, "pure PyTorch; runs on any device"),
    ]


def tf32_allowed(dtype: torch.dtype) -> bool:
    """Whether the kernels may multiply ``dtype`` inputs in TF32: float32 inputs, as PyTorch's
    ``torch.backends.cuda.matmul.allow_tf32`` says (read only for them: each read costs ~0.7 µs of a
    call's host path); other dtypes have no TF32 question."""
    return dtype == torch.float32 and bool(torch.backends.cuda.matmul.allow_tf32)


def requested_backend() -> str:
    name = os.environ.get("FLASHTILE_BACKEND", "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"FLASHTILE_BACKEND: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def select_backend(device: torch.device, dtype: torch.dtype) -> str:
    """Resolve ``FLASHTILE_BACKEND`` for tensors on ``device`` to 'triton' or 'reference'."""
    name = requested_backend()
    if name == "reference":
        return "reference"
    status = triton_status(device)
    if name == "triton":
        if not status.available:
            raise RuntimeError(f"FLASHTILE_BACKEND=triton, but the Triton backend is unavailable: {status.reason}")
        return "triton"
    # auto: the kernels for CUDA tensors; float64 stays on the exact reference path.
    if device.type == "cuda" and status.available and dtype != torch.float64:
        return "triton"
    return "reference"
