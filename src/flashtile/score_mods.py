"""User-defined score modifiers: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.

A score modifier changes each attention score before the softmax, as FlexAttention's
``score_mod`` does. It is plain Python over tensors, with operators and no Python
``if``/``and``/``or``; ``torch.where``, ``abs``, ``exp``, ``log``, ``sqrt``, ``maximum``,
``minimum`` and ``tanh`` may be called (the kernels run their Triton twins):

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + 0.1 * (kv_idx - q_idx)

    out = flashtile.attention(q, k, v, score_mod=flashtile.score_mod(relative_bias, grad=1.0))

Where it applies: ``score`` is ``q·k · softmax_scale``, after the built-in softcap and
ALiBi, before an additive ``bias`` and the masks. ``b`` and ``h`` are the batch entry and
query head, ``q_idx`` and ``kv_idx`` absolute positions (no bottom-right alignment), as
for ``mask_mod``. The result must be finite or -inf (-inf masks the score).

The same function runs in the reference backend on torch tensors and is compiled into
the Triton kernels with ``triton.jit``. The backward needs ``d score_mod / d score``:
the reference backend takes it from torch.func (forward mode); the kernels need it written as
a second function of the same arguments, ``grad=`` (``1.0`` for any additive modifier).
``score_mod`` checks that ``grad`` agrees with torch.func on a small probe. Without
``grad``, the kernels run the forward and refuse a backward with a clear error.

Ready modifiers: :func:`softcap_score` and :func:`alibi_score` (the built-in
``softcap=`` and ``alibi_slopes=`` written as score modifiers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from .mask_mods import _exec_source, _jit_user, _keep_on
from .op_names import OpNames, constant_under_compile

# The custom ops take a score modifier by name (see flashtile.op_names).
_names: OpNames[ScoreMod] = OpNames("score_mod")
# A plain function passed as score_mod=fn is wrapped once: the ScoreMod is kept on it.
_CACHE_ATTR = "_flashtile_score_mod"


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """A score modifier usable on both backends.

    ``torch_fn(score, b, h, q_idx, kv_idx, buffer)`` runs on torch tensors; the jitted
    forward and derivative (``triton_fns``) take the same arguments inside the kernels;
    ``buffer`` is the one float32 tensor the modifier reads (per-head slopes), or None.
    """

    name: str
    torch_fn: Callable
    triton_source: str | None = None  # generated modifiers: forward and derivative sources
    grad_source: str | None = None
    user_fn: Callable | None = None
    user_grad: Callable | None = None
    buffer: torch.Tensor | None = None
    per_head_buffer: bool = False  # buffer[h]: one value per query head
    _jit: list = field(default_factory=list, repr=False)

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.torch_fn(score, b, h, q_idx, kv_idx, self.buffer)

    @property
    def has_kernel_grad(self) -> bool:
        return self.grad_source is not None or self.user_grad is not None

    def derivative(self, score, b, h, q_idx, kv_idx):
        """d score_mod / d score at ``score``, elementwise: a forward-mode product with a
        tangent of ones (``torch.func.jvp``, which works inside the custom ops too, where
        the autograd recorder is switched off)."""
        def at(s):
            return torch.broadcast_to(torch.as_tensor(self(s, b, h, q_idx, kv_idx), dtype=s.dtype), s.shape)

        _, tangent = torch.func.jvp(at, (score,), (torch.ones_like(score),))
        return tangent

    def triton_fns(self):
        """(forward, derivative or None) as ``triton.jit`` functions for the kernels."""
        if not self._jit:
            self._jit.append(_jit_pair(self))
        return self._jit[0]


def _jit_pair(mod: ScoreMod):
    import triton
    import triton.language as tl

    from .kernels.common import _tanh

    if mod.user_fn is not None:  # a user's function reads torch.*: rebound to its Triton twins
        from .kernels import torch_twins

        def wrap(fn, name):
            return _jit_user(fn, name, "score, b, h, q_idx, kv_idx", "score_mod", {"torch": torch_twins})

        grad = wrap(mod.user_grad, f"{mod.name}_grad") if mod.user_grad is not None else None
        return wrap(mod.user_fn, mod.name), grad
    namespace = {"tl": tl, "_tanh": _tanh}
    fwd = triton.jit(_exec_source(mod.name, mod.triton_source, dict(namespace)))
    grad = triton.jit(_exec_source(f"{mod.name}_grad", mod.grad_source, dict(namespace)))
    return fwd, grad


def _probe_indices():
    b = torch.zeros(1, 1, 1, 1, dtype=torch.int64)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.int64)
    q = torch.arange(4).view(1, 1, -1, 1)
    kv = torch.arange(4).view(1, 1, 1, -1)
    return b, h, q, kv


def _check_grad(mod: ScoreMod) -> None:
    """The user's ``grad`` against torch.func's derivative of the user's function, on a 4×4 probe."""
    b, h, q, kv = _probe_indices()
    score = torch.linspace(-3.0, 3.0, 16, dtype=torch.float64).view(1, 1, 4, 4)
    try:
        expected = mod.derivative(score, b, h, q, kv)
    except RuntimeError:
        return  # not differentiable by torch.func (integer ops, say): nothing to compare against
    given = torch.broadcast_to(torch.as_tensor(mod.user_grad(score, b, h, q, kv), dtype=torch.float64), score.shape)
    if not torch.allclose(given, expected, rtol=1e-6, atol=1e-9):
        worst = float((given - expected).abs().max())
        raise ValueError(f"score_mod grad: does not match the derivative of {mod.name!r} computed by torch.func "
                         f"(max difference {worst:.3g} on a probe of scores in [-3, 3])")


def score_mod(fn: Callable, grad: Callable | float | None = None) -> ScoreMod:
    """Wrap a plain ``fn(score, b, h, q_idx, kv_idx)`` for both backends.

    ``grad``: ``d fn / d score`` as a function of the same arguments, or a number for a
    constant derivative (``1.0`` for an additive modifier). Needed for a backward through
    the Triton kernels; checked against torch.func on a small probe.
    """
    if isinstance(fn, ScoreMod):
        if grad is not None:
            raise ValueError(f"grad: {fn.name!r} is already a ScoreMod; pass grad= with the plain function")
        return fn
    cached = getattr(fn, _CACHE_ATTR, None)
    if grad is None and cached is not None:  # one ScoreMod (one compiled kernel) per plain function
        return cached
    if not callable(fn):
        raise TypeError(f"score_mod: expected a function (score, b, h, q_idx, kv_idx) -> score, "
                        f"got {type(fn).__name__}")
    name = getattr(fn, "__name__", "user_score")
    if name == "<lambda>":
        name = "user_score"
    if isinstance(grad, (int, float)) and not isinstance(grad, bool):
        constant = float(grad)
        grad = _constant_grad(constant)
    elif grad is not None and not callable(grad):
        raise TypeError(f"grad: expected a function (score, b, h, q_idx, kv_idx) -> derivative or a number, "
                        f"got {type(grad).__name__}")
    mod = ScoreMod(name, lambda s, b, h, q, kv, buffer: fn(s, b, h, q, kv), user_fn=fn, user_grad=grad)
    if grad is not None:
        _check_grad(mod)
        return mod
    return _keep_on(fn, _CACHE_ATTR, mod)


def _constant_grad(value: float) -> Callable:
    # Written out with the value in the source, so that triton.jit sees a plain function.
    src = f"def constant_grad(score, b, h, q_idx, kv_idx):\n    return score * 0.0 + {value!r}\n"
    return _exec_source("constant_grad", src, {})


def _generated(name: str, torch_body: str, triton_body: str, grad_body: str, buffer=None) -> ScoreMod:
    head = "(score, b, h, q_idx, kv_idx, buffer):\n    return "
    torch_fn = _exec_source(name, f"def {name}{head}{torch_body}\n", {"torch": torch})
    # The kernels read buffer[h] at buffer + h: a strided or expanded view is copied.
    buffer = buffer.contiguous() if buffer is not None else None
    return ScoreMod(name, torch_fn, triton_source=f"def {name}{head}{triton_body}\n",
                    grad_source=f"def {name}_grad{head}{grad_body}\n", buffer=buffer)


def softcap_score(softcap: float) -> ScoreMod:
    """``softcap · tanh(score / softcap)`` (Gemma 2, Grok), as the built-in ``softcap=``."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap > 0:
        raise ValueError(f"softcap: expected a number > 0, got {softcap!r}")
    c = float(softcap)
    return _generated(f"softcap_{str(c).replace('.', '_')}", f"{c!r} * torch.tanh(score / {c!r})",
                      f"{c!r} * _tanh(score / {c!r})", f"1.0 - _tanh(score / {c!r}) * _tanh(score / {c!r})")


def alibi_score(slopes: torch.Tensor) -> ScoreMod:
    """``score - slopes[h] · |q_idx - kv_idx|`` (ALiBi, symmetric distance).

    slopes: (heads_q,) float32 on the inputs' device. Unlike the built-in
    ``alibi_slopes=``, distances are not bottom-right aligned when seqlen_q != seqlen_k.
    """
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1 or slopes.dtype != torch.float32:
        raise TypeError("slopes: expected a 1-d float32 tensor of per-head slopes")
    mod = _generated("alibi", "score - buffer[h] * (q_idx - kv_idx).abs()",
                     "score - tl.load(buffer + h) * tl.abs(q_idx - kv_idx).to(tl.float32)",
                     "score * 0.0 + 1.0", buffer=slopes)
    return dataclasses.replace(mod, per_head_buffer=True)


@constant_under_compile
def register(mod: ScoreMod) -> str:
    """A name the custom ops can carry; the modifier stays registered while it is alive."""
    return _names.register(mod, mod.name)


def lookup(key: str) -> ScoreMod:
    return _names.lookup(key)
