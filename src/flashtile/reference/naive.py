"""Standard attention, materialising S and P: the oracle every test compares with.

This is the textbook computation::

    S = Q Kᵀ · scale            (softcap, ALiBi, bias added, mask applied)
    P = softmax(S)              (row-wise; fully masked rows give P = 0)
    O = dropout(P) V

with ``upcast=True`` it runs in float64, which is the truth for the numerical
contract (see :mod:`flashtile.testing`). With ``upcast=False`` it runs in the input
dtype and plays "standard attention" in the demo and in the tolerance rule.
It needs O(seqlen_q · seqlen_k) memory per head, by design.
"""

from __future__ import annotations

import math

import torch

from ..masks import alibi_bias, band_mask, normalize_window


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    score_mod=None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    upcast: bool = True,
    layout: str = "bshd",
    return_lse: bool = False,
):
    """Reference attention with every option of the public API.

    Args:
        q: (batch, seqlen_q, heads_q, headdim) for ``layout="bshd"`` or
            (batch, heads_q, seqlen_q, headdim) for ``layout="bhsd"``.
        k, v: the same with seqlen_k and heads_kv; heads_q % heads_kv == 0 (GQA/MQA:
            query head h uses KV head h // (heads_q // heads_kv)).
        causal, window_size: the band of :mod:`flashtile.masks` (bottom-right causal).
        softmax_scale: defaults to 1/sqrt(headdim).
        softcap: if > 0, scores become ``softcap * tanh(scores / softcap)`` (after
            scaling, before ALiBi and bias), as in flash-attn.
        alibi_slopes: (heads_q,) or (batch, heads_q); adds ``-slope * |i + sk - sq - j|``.
        bias: additive bias broadcastable to (batch, heads_q, seqlen_q, seqlen_k).
        score_mod: ``fn(score, b, h, q_idx, kv_idx) -> score`` (a plain function or a
            :class:`~flashtile.score_mods.ScoreMod`), applied after softcap and ALiBi and
            before the bias, on absolute indices; differentiated by autograd.
        dropout_p, dropout_mask: with dropout_p > 0, ``dropout_mask`` is the boolean
            keep-mask broadcastable to (batch, heads_q, seqlen_q, seqlen_k); kept
            probabilities are scaled by 1 / (1 - dropout_p). The LSE is not affected.
        upcast: compute in float64 (the truth) instead of the input dtype.
        return_lse: also return the row log-sum-exp, natural log,
            (batch, heads_q, seqlen_q), float64 if upcast else float32.

    Returns:
        out in the input layout, float64 if ``upcast`` else q's dtype; and the LSE
        when ``return_lse``. Fully masked rows give out = 0 and LSE = -inf.
    """
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    batch, heads_q, seqlen_q, headdim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if heads_kv != heads_q:  # the oracle may repeat K/V; the kernels never do
        k = k.repeat_interleave(heads_q // heads_kv, dim=1)
        v = v.repeat_interleave(heads_q // heads_kv, dim=1)

    scores = torch.matmul(q, k.transpose(-1, -2)) * softmax_scale  # (B, H, Sq, Sk)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes.to(dtype), seqlen_q, seqlen_k)
    if score_mod is not None:
        idx = [torch.arange(n, device=q.device).view([-1 if d == i else 1 for d in range(4)])
               for i, n in enumerate((batch, heads_q, seqlen_q, seqlen_k))]
        scores = torch.broadcast_to(score_mod(scores, *idx), scores.shape).to(dtype)
    if bias is not None:
        scores = scores + bias.to(dtype)

    allowed = band_mask(seqlen_q, seqlen_k, normalize_window(causal, window_size), q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    # A row "sees no key" when every score is -inf: masked by the band or by a -inf bias.
    # (A NaN score is not -inf: it propagates, as it should.)
    row_has_keys = ~(scores == float("-inf")).all(dim=-1, keepdim=True)
    # Softmax with the row max subtracted, so that huge finite biases (-1e30) stay exact;
    # empty rows get finite dummy scores so neither pass sees (-inf) - (-inf), then P = 0.
    safe = torch.where(row_has_keys, scores, 0.0)
    row_max = safe.amax(dim=-1, keepdim=True).detach()  # P does not depend on the shift
    unnormalised = torch.exp(safe - row_max) * row_has_keys
    row_sum = unnormalised.sum(dim=-1, keepdim=True)
    probs = unnormalised / torch.where(row_has_keys, row_sum, 1.0)
    lse = torch.where(row_has_keys, row_max + torch.log(torch.where(row_has_keys, row_sum, 1.0)),
                      float("-inf")).squeeze(-1)

    if dropout_p > 0.0:
        if dropout_mask is None:
            raise ValueError("dropout_mask: required when dropout_p > 0 (the oracle is deterministic)")
        probs = probs * dropout_mask.to(dtype) / (1.0 - dropout_p)

    out = torch.matmul(probs, v)  # (B, H, Sq, D)
    if layout == "bshd":
        out = out.transpose(1, 2)
    if return_lse:
        return out, (lse if upcast else lse.float())
    return out
