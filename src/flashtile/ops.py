"""The one attention core as ``torch.library`` custom ops, with fake impls and autograd.

Every public face ends here. The ops take q/k/v in the caller's layout ('bshd',
'bhsd', or 'thd' for packed variable-length batches), view them as (batch, heads,
seqlen, headdim) without copying, and hand the views (any strides) to a backend.
Outputs are allocated contiguous in the caller's layout. The ops have fake
implementations and their gradient lives in an autograd.Function around them
(:func:`attention`), so ``torch.compile(fullgraph=True)`` traces through them without
a graph break. Plain eager calls run the ops' bodies directly (``_call_directly``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .block_mask import lookup
from .masks import Band
from .score_mods import lookup as lookup_score_mod
from .reference.tiled import tiled_attention_backward, tiled_attention_forward
from .reference.varlen import varlen_backward, varlen_forward


def _to_bhsd(t: Tensor, layout: str) -> Tensor:
    if layout == "thd":  # packed (total, heads, headdim) -> (1, heads, total, headdim)
        return t.unsqueeze(0).transpose(1, 2)
    return t.transpose(1, 2) if layout == "bshd" else t


def _lse_shape(q: Tensor, layout: str) -> tuple[int, ...]:
    if layout == "thd":
        return q.shape[1], q.shape[0]  # (heads, total_q), as flash-attn's varlen LSE
    b, s, h = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bshd" else (q.shape[0], q.shape[2], q.shape[1])
    return b, h, s


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _new_like(t: Tensor, layout: str, backend: str) -> Tensor:
    # Packed tensors may have rows outside every sequence: they get zeros, never garbage
    # (the Triton launchers write only those rows; the reference path starts from zeros).
    if layout == "thd" and backend != "triton":
        return torch.zeros(t.shape, dtype=t.dtype, device=t.device)
    # (empty_like: a third of torch.empty's host time given the shape, dtype and device apart)
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def needs_grad(*tensors: Optional[Tensor]) -> bool:
    """Whether autograd records a call on these tensors (None entries are skipped)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _named(mask_key: Optional[str], score_key: Optional[str]):
    """The block mask and score_mod the ops' string arguments name (None where not given)."""
    return (lookup(mask_key) if mask_key is not None else None,
            lookup_score_mod(score_key) if score_key is not None else None)


def new_dropout_seed(device: torch.device) -> Tensor:
    """A dropout seed drawn from torch's generator of ``device``, kept on the device.

    One int64 element: the kernels load it, so drawing it never waits on the GPU and
    ``torch.manual_seed`` reproduces the mask.
    """
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def _seed_value(seed: Optional[Tensor]) -> int:
    # The reference backend draws its Philox numbers on the host: it needs the seed as an int.
    return int(seed.item()) if seed is not None else 0


# The ops are defined with torch.library.define/impl, not the @custom_op decorator: the
# decorator's Python wrapper cost ~40 µs per call (measured on the CPU, torch 2.13), as
# much as the rest of the launch path (pytorch/pytorch#139500 tracks it).
_LIBRARY = torch.library.Library("flashtile", "DEF")


def _define(name: str, fn, fake):
    """Register ``fn`` as ``flashtile::name`` for every device (the backend is an argument),
    with ``fake`` as its meta implementation; returns the op to call."""
    _LIBRARY.define(name + torch.library.infer_schema(fn, mutates_args=()))
    _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"flashtile::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.flashtile, name).default


def _attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: str,
    softmax_scale: float,
    window_left: Optional[int],
    window_right: Optional[int],
    softcap: float,
    alibi_slopes: Optional[Tensor],
    backend: str,
    allow_tf32: bool,
    bias: Optional[Tensor],
    dropout_p: float,
    dropout_seed: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    mask_key: Optional[str] = None,
    score_key: Optional[str] = None,
) -> tuple[Tensor, Tensor]:
    """Returns out (q's shape and layout) and the LSE, natural log: (batch, heads_q, seqlen_q),
    or (heads_q, total_q) for layout 'thd' (which takes the cu_seqlens and max_seqlen).

    ``bias`` is indexed (batch, heads_q, seqlen_q, seqlen_k) whatever the layout;
    ``mask_key`` names a registered block mask (with its mask_mod), ``score_key`` a
    registered score_mod. Not differentiable by itself: :func:`attention` adds the gradient.
    """
    if needs_grad(q, k, v, bias):
        # A direct call would otherwise return outputs whose backward silently gives no gradient.
        raise RuntimeError("flashtile::attention_forward has no gradient of its own: call flashtile.ops.attention "
                           "(or flashtile.attention) when q, k, v or the bias require grad")
    band = Band(window_left, window_right)
    block_mask, score_mod = _named(mask_key, score_key)
    out = _new_like(q, layout, backend)
    q_, k_, v_, out_ = (_to_bhsd(t, layout) for t in (q, k, v, out))
    if backend == "triton":
        from .kernels.launch import Varlen, attention_forward_triton

        varlen = Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) if layout == "thd" else None
        lse = attention_forward_triton(q_, k_, v_, out_, softmax_scale, band, softcap, alibi_slopes, allow_tf32,
                                       bias=bias, dropout_p=dropout_p, dropout_seed=dropout_seed, varlen=varlen,
                                       block_mask=block_mask, score_mod=score_mod)
    elif layout == "thd":
        lse = torch.empty(_lse_shape(q, layout), dtype=_lse_dtype(q), device=q.device).fill_(float("-inf"))
        varlen_forward(q_, k_, v_, out_, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, band, softcap, alibi_slopes,
                       dropout_p, _seed_value(dropout_seed))
    else:
        _, lse = tiled_attention_forward(q_, k_, v_, softmax_scale, band, softcap, alibi_slopes, out=out_, bias=bias,
                                         dropout_p=dropout_p, dropout_seed=_seed_value(dropout_seed),
                                         block_mask=block_mask, score_mod=score_mod)
    return out, lse


def _attention_forward_fake(q, k, v, layout, *args):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, layout), dtype=_lse_dtype(q), device=q.device)
    return out, lse


attention_forward = _define("attention_forward", _attention_forward, _attention_forward_fake)


def _attention_backward(
    dout: Tensor,
    dlse: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    layout: str,
    softmax_scale: float,
    window_left: Optional[int],
    window_right: Optional[int],
    softcap: float,
    alibi_slopes: Optional[Tensor],
    backend: str,
    allow_tf32: bool,
    bias: Optional[Tensor],
    dropout_p: float,
    dropout_seed: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    mask_key: Optional[str] = None,
    score_key: Optional[str] = None,
    bias_requires_grad: bool = False,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of q, k, v and the bias (an empty tensor unless ``bias_requires_grad``).

    ``dlse`` (may be None) is the gradient flowing into the LSE. ``deterministic``: the same
    bits on every call (only the fused Hopper backward, which adds dQ in no fixed order, can
    differ; it is skipped then, as under ``torch.use_deterministic_algorithms(True)``).
    """
    band = Band(window_left, window_right)
    block_mask, score_mod = _named(mask_key, score_key)
    dq, dk, dv = (_new_like(t, layout, backend) for t in (q, k, v))
    views = [_to_bhsd(t, layout) for t in (dout, q, k, v, out, dq, dk, dv)]
    dbias = None
    if backend == "triton":
        from .kernels.launch import Varlen, attention_backward_triton

        varlen = Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) if layout == "thd" else None
        dbias = attention_backward_triton(
            *views[:5], lse, dlse, softmax_scale, band, softcap, alibi_slopes, allow_tf32, *views[5:], bias=bias,
            dropout_p=dropout_p, dropout_seed=dropout_seed, bias_requires_grad=bias_requires_grad, varlen=varlen,
            block_mask=block_mask, score_mod=score_mod, deterministic=deterministic)
    elif layout == "thd":
        dout_, q_, k_, v_, out_, dq_, dk_, dv_ = views
        varlen_backward(dout_, q_, k_, v_, out_, lse, dlse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                        band, softcap, alibi_slopes, dropout_p, _seed_value(dropout_seed))
    else:
        dout_, q_, k_, v_, out_, dq_, dk_, dv_ = views
        if bias_requires_grad:
            # float32 accumulation, float64 for float64 inputs (the oracle's precision)
            dbias = torch.zeros(bias.shape, dtype=_lse_dtype(q), device=q.device)
        # The LSE's gradient enters as a shift of D: dS = P ∘ (dP − (D − dLSE)).
        tiled_attention_backward(dout_, q_, k_, v_, out_, lse, softmax_scale, band, softcap, alibi_slopes,
                                 dlse=dlse, dq=dq_, dk=dk_, dv=dv_, bias=bias, dbias=dbias, dropout_p=dropout_p,
                                 dropout_seed=_seed_value(dropout_seed), block_mask=block_mask,
                                 score_mod=score_mod)
    if dbias is None:
        return dq, dk, dv, q.new_empty(0)
    return dq, dk, dv, dbias.to(bias.dtype)


def _attention_backward_fake(dout, dlse, q, k, v, out, lse, layout, softmax_scale, window_left, window_right, softcap,
                             alibi_slopes, backend, allow_tf32, bias, dropout_p, dropout_seed, cu_seqlens_q,
                             cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask_key=None, score_key=None,
                             bias_requires_grad=False, deterministic=False):
    dbias = torch.empty(bias.shape, dtype=bias.dtype, device=q.device) if bias_requires_grad else q.new_empty(0)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format), dbias)


attention_backward = _define("attention_backward", _attention_backward, _attention_backward_fake)


_BIAS_OPTION = 8  # position of ``bias`` among attention_forward's inputs after q, k and v (the Function's options)

# Calling an op through the dispatcher costs its arguments' trip through the schema and back
# (~35 µs per op on a fast CPU for these 20-26 arguments, about twice that on the H200's host:
# probes/host_segments.py). In plain eager calls nothing listens there, so the ops' bodies are
# called directly; the ops stay the path whenever something could: torch.compile tracing, a
# dispatch or torch-function mode (FakeTensorMode, FlopCounterMode, ``with torch.device``), a
# tensor subclass, a functorch transform (vmap batches the ops by its fallback), the profiler
# (its trace then shows the ops), a meta or other device.
_len_dispatch_stack = getattr(torch._C, "_len_torch_dispatch_stack", None)
try:  # a functorch transform (vmap) wraps tensors that still look like plain ones
    from torch._C._functorch import peek_interpreter_stack as _functorch_transform
except ImportError:
    _functorch_transform = None
_DIRECT_DEVICES = ("cuda", "cpu")


def _call_directly(*tensors: Tensor) -> bool:
    """Whether an op's body may run without the dispatcher for a call on ``tensors``."""
    # is_compiling() first: Dynamo reads it as True and so traces none of the other questions.
    return (not torch.compiler.is_compiling() and _len_dispatch_stack is not None
            and _functorch_transform is not None and _functorch_transform() is None
            and all(type(t) is Tensor for t in tensors) and tensors[0].device.type in _DIRECT_DEVICES
            and not _len_dispatch_stack() and not torch._C._is_torch_function_mode_enabled()
            and not torch.autograd._profiler_enabled())


class _AttentionFunction(torch.autograd.Function):
    """Autograd of ``attention_forward``, outside the op.

    Not ``register_autograd``: torch runs ``fill_defaults`` on every call of an op that
    has a ``setup_context``, and it is quadratic in the number of arguments (93 µs per
    call at this op's 20, measured with torch 2.13; pytorch/pytorch#195110), which made
    short problems launch-bound. An autograd.Function around the op is the pattern
    PyTorch's custom-op maintainers recommend for low overhead, and torch.compile traces it.

    ``apply(q, k, v, bias, options, deterministic)``: the tensors autograd may differentiate,
    then attention_forward's inputs after v (the bias among them) as one tuple: Function.apply
    inspects each argument it is given, ~0.2 µs apiece (7.7 µs for the 21 of one flat list on a
    fast CPU, 4.5 for six; session 23).
    """

    # forward(ctx, ...) rather than a separate setup_context: with one, Function.apply
    # binds the arguments through inspect.signature on every call (~30 µs, torch 2.13).
    @staticmethod
    def forward(ctx, q, k, v, bias, options, deterministic):
        out, lse = (_attention_forward if _call_directly(q, k, v) else attention_forward)(q, k, v, *options)
        ctx.save_for_backward(q, k, v, out, lse, bias)
        # The options go back to the backward as they came, but for the bias: only the saved one is
        # kept (so that saved-tensor hooks, e.g. offloading, see every reference to it).
        if bias is not None:
            options = _with_bias(options, None)
        ctx.options, ctx.deterministic = options, deterministic
        ctx.bias_requires_grad = bias is not None and ctx.needs_input_grad[3]
        # Both stay alive until the backward (the registries hold them weakly). Not while
        # torch.compile traces: the compiled graph carries only their names.
        if not torch.compiler.is_compiling():
            ctx.block_mask, ctx.score_mod = _named(options[-2], options[-1])
        # An unused LSE (or output) then gives None, not a zero tensor to read: the
        # backward skips the dLSE term instead of adding zeros.
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, bias = ctx.saved_tensors
        if dout is None:  # only the LSE was used
            dout = torch.zeros_like(out)
        options = ctx.options if bias is None else _with_bias(ctx.options, bias)
        backward = _attention_backward if _call_directly(dout, q, k, v) else attention_backward
        dq, dk, dv, dbias = backward(dout, dlse, q, k, v, out, lse, *options, ctx.bias_requires_grad, ctx.deterministic)
        # q, k, v and the bias are differentiable; the options and deterministic are not.
        return dq, dk, dv, (dbias if ctx.bias_requires_grad else None), None, None


def _with_bias(options: tuple, bias: Optional[Tensor]) -> tuple:
    """The Function's options with ``bias`` in the bias's place."""
    return (*options[:_BIAS_OPTION], bias, *options[_BIAS_OPTION + 1:])


def attention(q: Tensor, k: Tensor, v: Tensor, layout: str, softmax_scale: float, window_left: Optional[int],
              window_right: Optional[int], softcap: float, alibi_slopes: Optional[Tensor], backend: str,
              allow_tf32: bool, bias: Optional[Tensor], dropout_p: float, dropout_seed: Optional[Tensor],
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
              mask_key: Optional[str] = None, score_key: Optional[str] = None,
              deterministic: bool = False) -> tuple[Tensor, Tensor]:
    """``attention_forward`` (same arguments and outputs) with its gradient: the entry of every face.

    Without a tensor that needs a gradient the op is called directly (an
    autograd.Function costs host time even when it records nothing). ``deterministic``: the
    backward gives the same bits on every call (attention_backward's argument).
    """
    options = (layout, softmax_scale, window_left, window_right, softcap, alibi_slopes, backend, allow_tf32, bias,
               dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask_key, score_key)
    if needs_grad(q, k, v, bias):
        return _AttentionFunction.apply(q, k, v, bias, options, deterministic)
    return (_attention_forward if _call_directly(q, k, v) else attention_forward)(q, k, v, *options)
