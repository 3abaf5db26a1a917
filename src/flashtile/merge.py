"""Merging partial attention results by their log-sum-exp.

Attention over a key set that is cut into parts (K/V chunks, splits of a KV cache,
a shared prefix and a per-request suffix, the blocks that travel around a ring) can
be computed part by part and combined exactly afterwards. Part ``i`` gives, per
query row, its output ``O_i`` and its log-sum-exp ``LSE_i = log Σ_{j in part i} exp(S_j)``.
Then::

    LSE = log Σ_i exp(LSE_i)                  (the LSE over all keys)
    O   = Σ_i exp(LSE_i − LSE) · O_i          (the weights sum to 1)

computed stably by shifting with ``m = max_i LSE_i``. A part that saw no key
(``LSE_i = −inf``) gets weight exactly 0, whatever its ``O_i`` holds (even NaN, as an
unwritten split may). A row where every part is empty gives ``O = 0``, ``LSE = −inf``
and zero gradients: never NaN, forward or backward.

Backward, with ``p_i = exp(LSE_i − LSE)`` and ``D_i = <dO, O_i>`` over headdim::

    dO_i   = p_i · dO
    dLSE_i = p_i · (D_i − Σ_j p_j D_j + dLSE)        (= p_i (<dO, O_i − O> + dLSE))

written out in an ``autograd.Function`` because torch's own ``logsumexp`` backward
gives NaN on rows that are all −inf. The math is plain PyTorch ops: under
``torch.compile`` the merge traces without a graph break and fuses with its
neighbours. All arithmetic runs in float32 (float64 when an input is float64).

Layouts (the LSE always has the layout flashtile's attention returns)::

    layout   out                              lse
    "bshd"   (batch, seqlen, heads, headdim)  (batch, heads, seqlen)
    "bhsd"   (batch, heads, seqlen, headdim)  (batch, heads, seqlen)
    "thd"    (total_tokens, heads, headdim)   (heads, total_tokens)   (varlen)
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import Tensor

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LSE_DTYPES = (torch.float32, torch.float64)

# layout -> (out's shape in words, lse's shape in words, out dims that make lse's dims)
_LAYOUTS = {
    "bshd": ("(batch, seqlen, heads, headdim)", "(batch, heads, seqlen)", (0, 2, 1)),
    "bhsd": ("(batch, heads, seqlen, headdim)", "(batch, heads, seqlen)", (0, 1, 2)),
    "thd": ("(total_tokens, heads, headdim)", "(heads, total_tokens)", (1, 0)),
}

States = Union[Tensor, Sequence[Tensor]]


# ---------------------------------------------------------------------------
# Between the LSE's layout and the out's layout: views, never copies.


def _lse_rows_to_out(x: Tensor, layout: str) -> Tensor:
    """An lse-shaped tensor as a view broadcastable against out: (..., 1) in out's dim order."""
    if layout == "bshd":
        x = x.transpose(1, 2)  # (B, H, S) -> (B, S, H)
    elif layout == "thd":
        x = x.transpose(0, 1)  # (H, T) -> (T, H)
    return x.unsqueeze(-1)


def _out_rows_to_lse(x: Tensor, layout: str) -> Tensor:
    """A per-row tensor in out's dim order (headdim reduced away) as a view in lse's layout."""
    if layout == "bshd":
        return x.transpose(1, 2)  # (B, S, H) -> (B, H, S)
    if layout == "thd":
        return x.transpose(0, 1)  # (T, H) -> (H, T)
    return x


def _compute_dtype(out_dtype: torch.dtype, lse_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in (out_dtype, lse_dtype) else torch.float32


# ---------------------------------------------------------------------------
# The math, forward and backward.


def _weights(lses: Sequence[Tensor], cdtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The weights p_i = exp(LSE_i - LSE), (n, *lse_shape), and LSE, both in ``cdtype``.

    p_i is 0 for an empty part and on rows where every part is empty (LSE = -inf there).
    """
    lse_parts = torch.stack([lse.to(cdtype) for lse in lses])  # (n, *lse_shape)
    m = lse_parts.amax(dim=0)
    # Rows where every part is empty: any finite shift will do, their weights are all 0.
    m = torch.where(m == float("-inf"), 0.0, m)
    w = torch.exp(lse_parts - m)  # exactly 0 for empty parts
    total = w.sum(dim=0)  # >= 1 (the largest part gives exp(0)) unless every part is empty
    lse = m + torch.log(total)  # log(0) = -inf on all-empty rows
    p = w / torch.where(total > 0, total, 1.0)  # all-empty rows: 0 / 1, not 0 / 0
    return p, lse


def _merge_forward(outs: Sequence[Tensor], lses: Sequence[Tensor], layout: str) -> tuple[Tensor, Tensor]:
    """Returns out (outs' dtype, contiguous in ``layout``) and lse (lses' dtype)."""
    cdtype = _compute_dtype(outs[0].dtype, lses[0].dtype)
    p, lse = _weights(lses, cdtype)
    acc = None
    for out_i, lse_i, p_i in zip(outs, lses, p):
        # An empty part's out is 0 by convention, but an unwritten buffer may hold NaN: 0 · NaN = NaN.
        term = _masked(out_i, lse_i, cdtype, layout) * _lse_rows_to_out(p_i, layout)
        acc = term if acc is None else acc + term
    return _own(acc, outs[0].dtype), _own(lse, lses[0].dtype)


def _own(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype).contiguous()``, without calling either when it would return ``t`` itself.

    Under torch.compile, torch 2.11 drops the gradient of an autograd.Function output
    that a no-op ``.to``/``.contiguous()`` made an alias of an intermediate: every input's
    gradient came back zero (found on the H200 image; tests/test_merge.py checks it).
    """
    if t.dtype != dtype:
        t = t.to(dtype)
    return t if t.is_contiguous() else t.contiguous()


def _masked(out_i: Tensor, lse_i: Tensor, cdtype: torch.dtype, layout: str) -> Tensor:
    """out_i in the compute dtype, with the rows of an empty part (LSE = -inf) set to 0."""
    empty = _lse_rows_to_out(lse_i == float("-inf"), layout)
    return out_i.to(cdtype).masked_fill(empty, 0.0)


def _merge_backward(dout: Tensor, dlse: Tensor, outs, lses, layout: str, need_douts: bool, need_dlses: bool):
    """Gradients of every out_i and lse_i (None where not needed)."""
    cdtype = _compute_dtype(outs[0].dtype, lses[0].dtype)
    # Recomputed in the compute dtype, not from the merged LSE: that one may be rounded to
    # float32, and exp(LSE_i - LSE) would then be off by |LSE| · 2^-24 relative.
    p, _ = _weights(lses, cdtype)
    dout = dout.to(cdtype)
    douts = [None] * len(outs)
    dlses = [None] * len(lses)
    if need_douts:
        douts = [(dout * _lse_rows_to_out(p_i, layout)).to(out_i.dtype) for out_i, p_i in zip(outs, p)]
    if need_dlses:
        # D_i = <dO, O_i> per row; then <dO, O> = Σ_j p_j D_j without the merged out in memory.
        d = torch.stack([
            _out_rows_to_lse((dout * _masked(out_i, lse_i, cdtype, layout)).sum(-1), layout)
            for out_i, lse_i in zip(outs, lses)
        ])  # (n, *lse_shape)
        d_merged = (p * d).sum(dim=0)
        dlse_parts = p * (d - d_merged + dlse.to(cdtype))
        dlses = [g.to(lse_i.dtype) for g, lse_i in zip(dlse_parts, lses)]
    return douts, dlses


class _MergeAttentionStates(torch.autograd.Function):
    """apply(layout, n, out_1..out_n, lse_1..lse_n) -> (out, lse)."""

    @staticmethod
    def forward(ctx, layout: str, n: int, *states: Tensor):
        outs, lses = states[:n], states[n:]
        out, lse = _merge_forward(outs, lses, layout)
        # The weights (n · rows numbers) are recomputed, not saved: then the backward is
        # made of differentiable ops of the inputs, and double backward is right too.
        ctx.save_for_backward(*states)
        ctx.layout, ctx.n = layout, n
        return out, lse

    @staticmethod
    def backward(ctx, dout: Tensor, dlse: Tensor):
        states = ctx.saved_tensors
        n = ctx.n
        outs, lses = states[:n], states[n:]
        need = ctx.needs_input_grad[2:]
        douts, dlses = _merge_backward(dout, dlse, outs, lses, ctx.layout, any(need[:n]), any(need[n:]))
        return (None, None, *douts, *dlses)


# ---------------------------------------------------------------------------
# Argument checking: each error names the argument.


def _describe(t: Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def _as_list(name: str, states: States, rank: int, words: str) -> list[Tensor]:
    """A sequence of tensors, or one tensor stacked along a new leading dim, as a list."""
    if isinstance(states, Tensor):
        if states.dim() != rank + 1:
            raise ValueError(
                f"{name}: expected a sequence of {rank}-d tensors {words} or one stacked {rank + 1}-d tensor "
                f"(num_states, ...), got a single {states.dim()}-d tensor ({_describe(states)}); "
                f"to merge one state, pass [tensor]"
            )
        return list(states.unbind(0))
    if not isinstance(states, (list, tuple)):
        raise TypeError(f"{name}: expected a list or tuple of tensors or one stacked tensor, "
                        f"got {type(states).__name__}")
    return list(states)


def _check_states(outs: list, lses: list, out_names: list, lse_names: list, layout: str) -> None:
    out_words, lse_words, lse_dims = _LAYOUTS[layout]
    rank = len(lse_dims) + 1
    for name, t in zip(out_names + lse_names, outs + lses):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    ref_out = outs[0]
    if ref_out.dim() != rank:
        raise ValueError(f"{out_names[0]}: expected a {rank}-d tensor {out_words} for layout {layout!r}, "
                         f"got {ref_out.dim()}-d ({_describe(ref_out)})")
    if ref_out.dtype not in OUT_DTYPES:
        raise TypeError(f"{out_names[0]}: expected dtype float16, bfloat16, float32 or float64, got {ref_out.dtype}")
    for name, t in zip(out_names[1:], outs[1:]):
        if t.shape != ref_out.shape:
            raise ValueError(f"{name}: expected shape {tuple(ref_out.shape)} (the shape of {out_names[0]}), "
                             f"got {tuple(t.shape)}")
        if t.dtype != ref_out.dtype:
            raise TypeError(f"{name}: expected dtype {ref_out.dtype} (the dtype of {out_names[0]}), got {t.dtype}")
    lse_shape = tuple(ref_out.shape[d] for d in lse_dims)
    ref_lse = lses[0]
    if ref_lse.dtype not in LSE_DTYPES:
        raise TypeError(f"{lse_names[0]}: expected dtype float32 (natural-log LSE, as flashtile returns it) "
                        f"or float64, got {ref_lse.dtype}")
    for name, t in zip(lse_names, lses):
        if tuple(t.shape) != lse_shape:
            raise ValueError(
                f"{name}: expected shape {lse_shape} = {lse_words} for outs of shape {tuple(ref_out.shape)} "
                f"= {out_words} (layout {layout!r}), got {tuple(t.shape)}"
            )
        if t.dtype != ref_lse.dtype:
            raise TypeError(f"{name}: expected dtype {ref_lse.dtype} (the dtype of {lse_names[0]}), got {t.dtype}")
    for name, t in zip(out_names + lse_names, outs + lses):
        if t.device != ref_out.device:
            raise ValueError(f"{name}: expected device {ref_out.device} (the device of {out_names[0]}), "
                             f"got {t.device}")


def _check_layout(layout) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(repr(k) for k in _LAYOUTS)}, got {layout!r}")


# ---------------------------------------------------------------------------
# Public functions.


def merge_attention_states(outs: States, lses: States, *, layout: str = "bshd") -> tuple[Tensor, Tensor]:
    """Combine partial attention results over disjoint key sets into the result over their union.

    Args:
        outs: the parts' outputs: a list or tuple of tensors of one shape and dtype, or one
            tensor stacked along a new leading dim (num_states, ...). Each is
            (batch, seqlen_q, heads, headdim) for ``layout="bshd"`` (flashtile's and
            flash-attn's order), (batch, heads, seqlen_q, headdim) for ``"bhsd"``, or
            (total_q, heads, headdim) for ``"thd"`` (varlen). float16, bfloat16, float32
            or float64; any strides.
        lses: the matching log-sum-exps, natural log, as ``attention(..., return_lse=True)``
            returns them: (batch, heads, seqlen_q) for "bshd" and "bhsd", (heads, total_q)
            for "thd"; float32 (float64 accepted). Same container rules as ``outs``.
            Values are finite or -inf (the part saw no key); +inf or NaN give NaN.
        layout: "bshd", "bhsd" or "thd".

    Returns:
        ``(out, lse)``: out in the outs' shape and dtype, contiguous in ``layout``; lse in
        the lses' shape and dtype. Arithmetic in float32 (float64 if an input is float64).
        A part with LSE -inf gets weight exactly 0; rows with every LSE -inf give out 0,
        LSE -inf and zero gradients. Differentiable with respect to every out and lse.

    Example, split-KV::

        out_a, lse_a = flashtile.attention(q, k[:, :n], v[:, :n], return_lse=True)
        out_b, lse_b = flashtile.attention(q, k[:, n:], v[:, n:], return_lse=True)
        out, lse = merge_attention_states([out_a, out_b], [lse_a, lse_b])
        # == flashtile.attention(q, k, v, return_lse=True), up to rounding
    """
    _check_layout(layout)
    rank = len(_LAYOUTS[layout][2]) + 1
    outs = _as_list("outs", outs, rank, _LAYOUTS[layout][0])
    lses = _as_list("lses", lses, rank - 1, _LAYOUTS[layout][1])
    if len(outs) == 0:
        raise ValueError("outs: expected at least one partial result, got none")
    if len(lses) != len(outs):
        raise ValueError(f"lses: expected one LSE per out ({len(outs)}), got {len(lses)}")
    _check_states(outs, lses, [f"outs[{i}]" for i in range(len(outs))], [f"lses[{i}]" for i in range(len(lses))],
                  layout)
    return _MergeAttentionStates.apply(layout, len(outs), *outs, *lses)


def merge_attention_states_pair(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, *,
                                layout: str = "bshd") -> tuple[Tensor, Tensor]:
    """Two-state form of :func:`merge_attention_states` (FlashInfer's ``merge_state``).

    The step of ring attention and cascade attention: ``out, lse = merge(out, lse, o, l)``.
    Shapes, dtypes, layouts and the -inf rules are those of :func:`merge_attention_states`;
    merging is associative and commutative up to rounding.
    """
    _check_layout(layout)
    _check_states([out_a, out_b], [lse_a, lse_b], ["out_a", "out_b"], ["lse_a", "lse_b"], layout)
    return _MergeAttentionStates.apply(layout, 2, out_a, out_b, lse_a, lse_b)
