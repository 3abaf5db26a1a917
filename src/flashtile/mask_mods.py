"""User-defined attention masks: ``mask_mod(b, h, q_idx, kv_idx) -> bool``, written once.

A mask function is plain Python over index tensors, using operators only (``&``,
``|``, ``~``, comparisons, arithmetic) and no Python ``if``/``and``/``or``:

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

The same function runs in the reference backend on torch tensors and is compiled
into the Triton kernels with ``triton.jit`` (called per tile with broadcast index
tensors). Factories below build ready masks with their constants written into the
function's source, so they too compile; a mask may read one int32 tensor (the
document ids of ``document_mask``), which the kernels receive as a pointer.

    mask = and_masks(causal_mask(), sliding_window_mask(256))

Indices are absolute positions: ``q_idx`` in [0, seqlen_q), ``kv_idx`` in
[0, seqlen_k) (no bottom-right alignment is applied: write it into the mask if
wanted). For seqlen_q = seqlen_k = 4, ``causal_mask()`` and ``sliding_window_mask(1)``::

    causal      window 1 (and causal)
    x . . .     x . . .
    x x . .     x x . .
    x x x .     . x x .
    x x x x     . . x x
"""

from __future__ import annotations

import functools
import itertools
import linecache
import sys
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

_counter = itertools.count()


# A plain function passed as mask_mod=fn is wrapped once: the MaskMod is kept on it.
_CACHE_ATTR = "_flashtile_mask_mod"


@dataclass(frozen=True, eq=False)
class MaskMod:
    """A mask usable on both backends.

    torch_fn(b, h, q_idx, kv_idx, buffer) runs on torch tensors; ``triton_fn`` is the
    ``triton.jit`` function of the same signature (built on first use); ``buffer`` is
    the one int32 tensor the mask reads, or None.
    """

    name: str
    torch_fn: Callable
    source: str | None  # source of a generated mask (None for a user function)
    user_fn: Callable | None = None
    buffer: torch.Tensor | None = None
    parts: tuple = ()
    # (lower, upper) when the mask is the band lower <= kv_idx - q_idx <= upper (None: unbounded
    # on that side) for every b and h: block masks then classify its tiles in closed form.
    band: tuple | None = None
    _jit: list = field(default_factory=list, repr=False)

    def __call__(self, b, h, q_idx, kv_idx):
        return self.torch_fn(b, h, q_idx, kv_idx, self.buffer)

    def triton_fn(self):
        """The jitted mask (compiled into the kernels as a constexpr function)."""
        if not self._jit:
            self._jit.append(_jit_mask(self))
        return self._jit[0]


def _exec_source(name: str, source: str, namespace: dict) -> Callable:
    """Define the function ``name`` from generated ``source`` in a module of its own.

    The source is registered in linecache, so that inspect.getsource (which triton.jit
    uses) finds it. The module is registered in sys.modules and holds ``namespace``
    (the parts of a combined mask, say): Triton reads the function's ``__module__``,
    and torch.compile looks the function's globals up through it.
    """
    number = next(_counter)
    filename = f"<flashtile-mask-{name}-{number}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(f"{__name__}._generated_{number}")
    module.__dict__.update(namespace)
    sys.modules[module.__name__] = module
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our own generated source
    return module.__dict__[name]


def _jit_user(fn: Callable, name: str, params: str, kind: str, extra_globals: dict | None = None):
    """A user's function (a mask_mod or score_mod taking ``params``) as a jitted function
    that also takes the kernels' ``buffer`` argument, which it ignores.

    ``extra_globals`` rebind names the function reads (a score_mod's ``torch``).
    """
    # triton.jit compiles a function from its def's source text.
    if not isinstance(fn, types.FunctionType):
        raise ValueError(f"{kind}: the Triton kernels compile a function defined with def, got "
                         f"{type(fn).__name__} (the reference backend runs any callable)")
    if fn.__name__ == "<lambda>":
        raise ValueError(f"{kind}: a lambda cannot be compiled into the Triton kernels; define it with def "
                         "(the reference backend runs either)")
    import triton
    import triton.language as tl

    # Triton wants triton.language among the function's globals, even when unused.
    namespace = {**fn.__globals__, "tl": tl, **(extra_globals or {})}
    fn = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    # Triton keys its compiled kernels by source text, not by closure or global values: two
    # functions from one factory (``make(0.5)``, ``make(-3.0)``) would share one kernel. A
    # token unique to this wrapping makes each its own key (it is compiled with its values).
    src = (f"def {name}({params}, buffer):\n    # flashtile {kind} #{next(_counter)}\n"
           f"    return _user({params})\n")
    return triton.jit(_exec_source(name, src, {"_user": triton.jit(fn), "tl": tl}))


def _jit_mask(mask: MaskMod):
    import triton
    import triton.language as tl

    if mask.user_fn is not None:  # a user's 4-argument function, wrapped to take the buffer
        return _jit_user(mask.user_fn, mask.name, "b, h, q_idx, kv_idx", "mask_mod")
    namespace = {"tl": tl}
    for i, part in enumerate(mask.parts):
        namespace[f"_m{i}"] = part.triton_fn()
    src = mask.source.replace("buffer[q_idx]", "tl.load(buffer + q_idx)").replace(
        "buffer[kv_idx]", "tl.load(buffer + kv_idx)")
    return triton.jit(_exec_source(mask.name, src, namespace))


def _generated(name: str, body: str, buffer=None, parts: tuple = (), band: tuple | None = None) -> MaskMod:
    source = f"def {name}(b, h, q_idx, kv_idx, buffer):\n    return {body}\n"
    namespace = {f"_m{i}": p.torch_fn for i, p in enumerate(parts)}
    # The kernels read buffer[i] at buffer + i: a strided or expanded view is copied.
    buffer = buffer.contiguous() if buffer is not None else None
    return MaskMod(name, _exec_source(name, source, namespace), source, buffer=buffer, parts=parts, band=band)


def mask_mod(fn: Callable) -> MaskMod:
    """Wrap a plain ``fn(b, h, q_idx, kv_idx)`` (operators only; no closures or globals
    other than jitted functions) so that both backends can run it.

    A function is wrapped once (the MaskMod is kept on it, as score_mod does): so that
    ``create_block_mask(fn, ...)`` pairs with ``attention(..., mask_mod=fn, block_mask=bm)``,
    and repeated calls with ``mask_mod=fn`` reuse one block mask and one compiled kernel.
    """
    if isinstance(fn, MaskMod):
        return fn
    cached = getattr(fn, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    if not callable(fn):
        raise TypeError(f"mask_mod: expected a function (b, h, q_idx, kv_idx) -> bool, got {type(fn).__name__}")
    mod = MaskMod(getattr(fn, "__name__", "user_mask"), lambda b, h, q, kv, buffer: fn(b, h, q, kv), None,
                  user_fn=fn)
    return _keep_on(fn, _CACHE_ATTR, mod)


def _keep_on(fn: Callable, attr: str, wrapper):
    """Keep ``wrapper`` on the user's ``fn`` as ``attr`` and return it: it goes when the
    function goes. A callable that takes no attributes is wrapped anew on each call."""
    try:
        setattr(fn, attr, wrapper)
    except (AttributeError, TypeError):
        pass
    return wrapper


def causal_mask() -> MaskMod:
    """Query i sees keys 0..i (top-left aligned)."""
    return _generated("causal", "q_idx >= kv_idx", band=(None, 0))


def sliding_window_mask(window: int) -> MaskMod:
    """Query i sees keys i - window .. i + window (combine with causal_mask() for a causal window)."""
    window = _non_negative("window", window)
    return _generated(f"window_{window}", f"(q_idx - kv_idx <= {window}) & (kv_idx - q_idx <= {window})",
                      band=(-window, window))


@functools.lru_cache(maxsize=64)
def band_mask_mod(lower: int | None, upper: int | None) -> MaskMod:
    """Key kv_idx is seen from query q_idx when ``lower <= kv_idx - q_idx <= upper`` (None:
    unbounded on that side): masks.py's band with its offset folded in, ``lower = offset -
    window_left`` and ``upper = offset + window_right``. One MaskMod per pair, so that calls
    with the same band share its block masks and compiled kernels."""
    terms = []
    if lower is not None:
        terms.append(f"(kv_idx - q_idx >= ({lower}))")
    if upper is not None:
        terms.append(f"(kv_idx - q_idx <= ({upper}))")
    if not terms:
        raise ValueError("band_mask_mod: give at least one bound")
    name = "band_" + "_".join("x" if v is None else (f"m{-v}" if v < 0 else str(v)) for v in (lower, upper))
    return _generated(name, " & ".join(terms), band=(lower, upper))


def prefix_lm_mask(prefix_length: int) -> MaskMod:
    """Bidirectional over the first ``prefix_length`` keys, causal after them."""
    prefix_length = _non_negative("prefix_length", prefix_length)
    return _generated(f"prefix_lm_{prefix_length}", f"(kv_idx < {prefix_length}) | (q_idx >= kv_idx)")


def chunked_mask(chunk: int) -> MaskMod:
    """Attention only within chunks of ``chunk`` positions (chunked-local attention)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk: expected an int >= 1, got {chunk!r}")
    return _generated(f"chunked_{chunk}", f"(q_idx // {chunk}) == (kv_idx // {chunk})")


def document_mask(document_ids: torch.Tensor) -> MaskMod:
    """Packed sequences: query and key attend only within the same document.

    document_ids: (seqlen,) int32, the document of each position (queries and keys of
    self-attention over the packed sequence).
    """
    if not isinstance(document_ids, torch.Tensor) or document_ids.dim() != 1 or document_ids.dtype != torch.int32:
        raise TypeError("document_ids: expected a 1-d int32 tensor of per-position document ids")
    return _generated("document", "buffer[q_idx] == buffer[kv_idx]", buffer=document_ids)


def _combine(op: str, name: str, masks) -> MaskMod:
    parts = tuple(mask_mod(m) for m in masks)
    if not parts:
        raise ValueError(f"{name}: expected at least one mask")
    buffers = [p.buffer for p in parts if p.buffer is not None]
    if len({id(b) for b in buffers}) > 1:
        raise ValueError(f"{name}: at most one of the combined masks may read a tensor (document ids)")
    body = f" {op} ".join(f"_m{i}(b, h, q_idx, kv_idx, buffer)" for i in range(len(parts)))
    return _generated(f"{name}_{next(_counter)}", body, buffer=buffers[0] if buffers else None, parts=parts)


def and_masks(*masks) -> MaskMod:
    """Visible where every mask is."""
    return _combine("&", "and_masks", masks)


def or_masks(*masks) -> MaskMod:
    """Visible where any mask is."""
    return _combine("|", "or_masks", masks)


def _non_negative(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
    return value


def dense_mask(mask: MaskMod, batch: int, heads: int, seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """The full (batch, heads, seqlen_q, seqlen_k) boolean mask (for the oracle and small pictures)."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    q = torch.arange(seqlen_q, device=device).view(1, 1, -1, 1)
    kv = torch.arange(seqlen_k, device=device).view(1, 1, 1, -1)
    return torch.broadcast_to(mask(b, h, q, kv), (batch, heads, seqlen_q, seqlen_k))


def draw(mask: MaskMod, seqlen_q: int, seqlen_k: int) -> str:
    """A small picture of the mask of batch 0, head 0 (x = visible)."""
    m = dense_mask(mask, 1, 1, seqlen_q, seqlen_k)[0, 0]
    return "\n".join(" ".join("x" if v else "." for v in row.tolist()) for row in m)
