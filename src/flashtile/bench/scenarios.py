"""What is benchmarked: a scenario turns one case of the grid into a problem.

A scenario says which (query, key) pairs attend (a causal / sliding-window band, or
packed documents), makes the inputs and counts the FLOPs. Providers ask it for what they need: the
flash-attn ``window_size`` (flashtile, naive attention, flash-attn) or a FlexAttention
``mask_mod``; a provider that cannot express a scenario raises ``Unsupported`` and the
harness records a skip. Later scenarios (varlen, decode) register here with their own
``inputs`` and ``pairs`` and the providers that understand them.

    SCENARIOS["sliding-window"](window=1024) -> Scenario
    SCENARIOS["document"](documents=8) -> Scenario
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from .harness import Case

# Work of each timed pass in units of the forward's FLOPs (the field's convention:
# the backward does 2.5× the forward's matmul work).
MODE_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


@dataclass(frozen=True)
class Scenario:
    """One attention problem family.

    window: keys on each side of the query within reach; None = dense. Causal keeps
        only the left side, as flash-attn's ``window_size=(window, 0)``.
    documents: the sequence packs this many documents of (near) equal length, each
        attending only within itself (a block-sparse document mask); None = one.
    """

    name: str
    description: str
    window: int | None = None
    documents: int | None = None

    @property
    def dense(self) -> bool:
        """Full or plain causal attention: what SDPA's ``is_causal`` can express."""
        return self.window is None and self.documents is None

    def document_ids(self, seqlen: int, device) -> torch.Tensor:
        """(seqlen,) int32, the document of each position; sizes differ by at most one."""
        return (torch.arange(seqlen, device=device) * self.documents // seqlen).to(torch.int32)

    def window_size(self, causal: bool) -> tuple[int, int]:
        """flash-attn's (left, right), -1 = unbounded; ``causal`` is passed beside it."""
        if self.window is None:
            return (-1, -1)
        return (self.window, 0 if causal else self.window)

    def band(self, causal: bool) -> tuple[int | None, int | None]:
        """(left, right): query i sees keys i - left .. i + right; None = unbounded.

        Square problems only (seqlen_q = seqlen_k), where bottom-right and top-left
        causal alignment agree.
        """
        left, right = (None if w < 0 else w for w in self.window_size(causal))
        return left, 0 if causal else right

    def inputs(self, case: Case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Random q, k, v: (batch, heads, seqlen, headdim) views of (batch, seqlen, heads, headdim)
        storage, which every provider takes without a copy (flash-attn transposes back)."""
        shape = (case.batch, case.seqlen, case.heads, case.headdim)
        return tuple(
            torch.randn(shape, device=device, dtype=case.dtype).transpose(1, 2).requires_grad_()
            for _ in range(3)
        )

    def pairs(self, case: Case) -> float:
        """(query, key) pairs computed per (batch, head).

        Dense: N² and N²/2 when causal, the field's convention (the diagonal is not
        counted). A window: the exact number of pairs inside the band.
        """
        n = case.seqlen
        if self.documents is not None:  # each document is a dense (or causal) problem of its own
            sizes = torch.bincount(self.document_ids(n, "cpu").long()).double()
            return float((sizes * sizes).sum()) / (2 if case.causal else 1)
        if self.dense:
            return n * n / (2 if case.causal else 1)
        left, right = self.band(case.causal)
        i = torch.arange(n, dtype=torch.int64)
        first = torch.zeros_like(i) if left is None else (i - left).clamp(min=0)
        last = torch.full_like(i, n - 1) if right is None else (i + right).clamp(max=n - 1)
        return float((last - first + 1).clamp(min=0).sum())

    def flops(self, case: Case, mode: str) -> float:
        """4·B·H·pairs·D for the forward (two matmuls of 2 FLOPs per multiply-add)."""
        return 4.0 * case.batch * case.heads * self.pairs(case) * case.headdim * MODE_FLOPS[mode]


def dense(**_options) -> Scenario:
    return Scenario("dense", "full attention, or causal")


def sliding_window(*, window: int = 1024, **_options) -> Scenario:
    if window < 0:
        raise ValueError(f"sliding-window: window must be >= 0, got {window}")
    return Scenario("sliding-window", f"window of {window} keys (left only when causal)", window=window)


def document(*, documents: int = 8, **_options) -> Scenario:
    if documents < 1:
        raise ValueError(f"document: documents must be >= 1, got {documents}")
    return Scenario("document", f"{documents} packed documents, attention within each (block-sparse mask)",
                    documents=documents)


# name -> factory(**options); options the CLI knows today: window, documents.
SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "dense": dense,
    "sliding-window": sliding_window,
    "document": document,
}
