"""One small adapter per implementation: how to call it on a case of the grid.

``build(case, q, k, v)`` returns a forward callable; q, k, v are (batch, heads, seqlen,
headdim) with requires_grad, so the harness can also time the backward through
autograd. An adapter raises ``Unsupported`` for what it cannot run (a device, a
scenario, memory that would not fit); anything else raised during a run is recorded
by the harness as a failure of that cell, never a crash of the run.

Heavy or optional imports (FlexAttention, flash-attn) happen inside ``build``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .harness import Case

Forward = Callable[[], torch.Tensor]


class Unsupported(Exception):
    """This provider does not run this case; the message says why."""


@dataclass(frozen=True)
class Provider:
    name: str
    label: str
    build: Callable[..., Forward]
    devices: tuple[str, ...] = ("cpu", "cuda")
    # Bytes of N×N-sized buffers one pass allocates (backward: True for the backward
    # pass), checked against free memory before that pass.
    quadratic_bytes: Callable[[Case, bool], int] | None = None
    missing: Callable[[], str | None] = lambda: None  # why it cannot be imported, if so

    def check(self, case: Case, device: torch.device, backward: bool) -> None:
        """Raise Unsupported when this provider should not even be tried on ``case``."""
        if device.type not in self.devices:
            raise Unsupported(f"GPU-only provider, device is {device.type}")
        reason = self.missing()
        if reason:
            raise Unsupported(reason)
        if self.quadratic_bytes is not None:
            need, free = self.quadratic_bytes(case, backward), free_bytes(device)
            if free is not None and need > 0.8 * free:
                raise Unsupported(
                    f"would need ~{need / 2**30:.1f} GiB for N×N buffers (estimate), {free / 2**30:.1f} GiB free"
                )


def free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        # Blocks PyTorch's caching allocator holds but does not use are free to us too.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _score_matrices_bytes(itemsize: Callable[[Case], int]) -> Callable[[Case, bool], int]:
    """Standard attention allocates ~4 N×N tensors per pass (S, P and temporaries in the
    forward; dP, dS and temporaries in the backward, on top of what the forward saved,
    which is already out of the free memory by then): an over-estimate on purpose, to
    skip rather than run out of memory mid-grid."""

    def estimate(case: Case, backward: bool) -> int:
        return 4 * case.batch * case.heads * case.seqlen ** 2 * itemsize(case)

    return estimate


def _require_dense(case: Case, who: str) -> None:
    if not case.scenario.dense:
        raise Unsupported(f"{who} has no {case.scenario.name} mode (only an explicit N×N mask)")


# -- adapters


def _flashtile(case: Case, q, k, v) -> Forward:
    from .. import attention

    if case.scenario.documents is not None:
        from ..block_mask import create_block_mask
        from ..mask_mods import and_masks, causal_mask, document_mask

        mask = document_mask(case.scenario.document_ids(case.seqlen, q.device))
        mask = and_masks(causal_mask(), mask) if case.causal else mask
        block_mask = create_block_mask(mask, 1, 1, case.seqlen, case.seqlen, device=q.device)  # built once
        return lambda: attention(q, k, v, mask_mod=mask, block_mask=block_mask, layout="bhsd")
    window = case.scenario.window_size(case.causal)
    return lambda: attention(q, k, v, causal=case.causal, window_size=window, layout="bhsd")


def _naive(case: Case, q, k, v) -> Forward:
    from ..reference import naive_attention

    window = case.scenario.window_size(case.causal)
    bias = document_bias(case, q.device, q.dtype)
    return lambda: naive_attention(q, k, v, causal=case.causal, window_size=window, bias=bias, upcast=False,
                                   layout="bhsd")


def document_bias(case: Case, device, dtype) -> torch.Tensor | None:
    """The document scenario as an additive (seqlen, seqlen) mask: 0 within a document, -inf across."""
    if case.scenario.documents is None:
        return None
    ids = case.scenario.document_ids(case.seqlen, device)
    return torch.zeros(case.seqlen, case.seqlen, device=device, dtype=dtype).masked_fill(
        ids[:, None] != ids[None, :], float("-inf"))


def _sdpa(backend_name: str | None, who: str) -> Callable[..., Forward]:
    """SDPA pinned to one backend (None: PyTorch's own choice)."""

    def build(case: Case, q, k, v) -> Forward:
        _require_dense(case, who)
        if backend_name is None:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)

        def run():
            # The backward node is chosen with the forward: no context needed there.
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

        return run

    return build


_compiled_flex = None


def _flex(case: Case, q, k, v) -> Forward:
    global _compiled_flex
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _compiled_flex is None:
        # Every shape of the grid is its own compiled graph. Past Dynamo's recompile
        # limit (8) it would silently run eagerly: lift the limits, and fail loudly if
        # they are hit anyway rather than time an uncompiled FlexAttention.
        config = torch._dynamo.config
        for name in ("recompile_limit", "accumulated_recompile_limit",  # torch >= 2.7; older names:
                     "cache_size_limit", "accumulated_cache_size_limit"):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 4096))
        if hasattr(config, "fail_on_recompile_limit_hit"):
            config.fail_on_recompile_limit_hit = True
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    left, right = case.scenario.band(case.causal)
    block_mask = None
    if case.scenario.documents is not None:
        ids = case.scenario.document_ids(case.seqlen, q.device)

        def in_document(b, h, q_idx, kv_idx):
            return ids[q_idx] == ids[kv_idx]

        def in_causal_document(b, h, q_idx, kv_idx):
            return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

        block_mask = create_block_mask(in_causal_document if case.causal else in_document, B=None, H=None,
                                       Q_LEN=case.seqlen, KV_LEN=case.seqlen, device=q.device)
    elif left is not None or right is not None:

        def in_band(b, h, q_idx, kv_idx):
            offset = q_idx - kv_idx  # > 0: the key is left of the query
            if left is None:
                return offset >= -right
            if right is None:
                return offset <= left
            return (offset >= -right) & (offset <= left)

        block_mask = create_block_mask(in_band, B=None, H=None, Q_LEN=case.seqlen, KV_LEN=case.seqlen,
                                       device=q.device)
    compiled = _compiled_flex
    return lambda: compiled(q, k, v, block_mask=block_mask)


def _flash_attn(case: Case, q, k, v) -> Forward:
    from flash_attn import flash_attn_func

    if case.scenario.documents is not None:
        raise Unsupported("flash-attn expresses documents as a varlen batch, not wired into this scenario")
    window = case.scenario.window_size(case.causal)
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # (B, S, H, D), contiguous
    return lambda: flash_attn_func(q_, k_, v_, causal=case.causal, window_size=window)


def _flash_attn_missing() -> str | None:
    return None if importlib.util.find_spec("flash_attn") else "flash-attn is not installed"


def _itemsize(case: Case) -> int:
    return case.dtype.itemsize


PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Provider("flashtile", "flashtile", _flashtile),
    Provider("sdpa-flash", "SDPA flash (FA2)", _sdpa("FLASH_ATTENTION", "SDPA"), devices=("cuda",)),
    Provider("sdpa-cudnn", "SDPA cuDNN", _sdpa("CUDNN_ATTENTION", "SDPA"), devices=("cuda",)),
    Provider("sdpa-efficient", "SDPA efficient", _sdpa("EFFICIENT_ATTENTION", "SDPA"), devices=("cuda",)),
    # The math backend computes in float32 for half inputs (torch's default).
    Provider("sdpa-math", "SDPA math", _sdpa("MATH", "SDPA"), quadratic_bytes=_score_matrices_bytes(lambda c: 4)),
    Provider("sdpa", "SDPA (default)", _sdpa(None, "SDPA")),
    Provider("flex", "FlexAttention (compiled)", _flex, devices=("cuda",)),
    Provider("naive", "naive attention", _naive, quadratic_bytes=_score_matrices_bytes(_itemsize)),
    Provider("flash-attn", "flash-attn", _flash_attn, devices=("cuda",), missing=_flash_attn_missing),
)}

# On a GPU, SDPA's own choice duplicates one of its pinned backends.
DEFAULT_PROVIDERS = {
    "cpu": [name for name in PROVIDERS],
    "cuda": [name for name in PROVIDERS if name != "sdpa"],
}
