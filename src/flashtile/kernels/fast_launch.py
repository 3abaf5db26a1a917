"""Launching a kernel Triton has already built, without ``JITFunction.run``'s per-call binding.

``kernel[grid](*args, **constexprs)`` specialises every argument on every call (each int by
value class, each tensor by dtype and alignment, each descriptor by element type, block and
layout), turns that into a cache key, finds the compiled kernel, checks the globals the kernel
read, and only then launches. For the Hopper backward's three launches that was about a third
of a 16 × 1k call's host time on the H200 (session 12's profile, docs/performance.md), and at
that size the host path is as long as the kernels.

``launch`` keeps, per kernel, the compiled kernel Triton returned for a key at least as fine as
Triton's own specialisation (ints by what Triton reads of them: equal to 1, a multiple of 16,
32- or 64-bit; bools by value, floats by type, tensors by dtype and 16-byte alignment,
descriptors by tensor dtype, shape, strides, block, layout and alignment, the constexprs and
the device), so a hit can only find the binary Triton itself would have picked
(tests/test_fast_launch.py checks the ints' classes against the installed Triton's). A miss, an
argument of a kind not listed here, or a kernel behind triton.autotune or triton.heuristics
(which choose parameters per call) takes the ordinary ``kernel[grid]`` path. A hit launches
through ``CompiledKernel[grid]``, which builds the descriptors' TMA maps and calls the launcher
as Triton's own run does (launch hooks included).

What a hit skips: Triton's check that the globals a kernel read are unchanged (flashtile's are
constants, and mask and score functions are compiled from copies), pre-run hooks, and the
per-call reading of Triton's compilation settings (``TRITON_DEBUG``, instrumentation, the
sanitizer's casts, stage-inspection hooks): set those before the first launch, or turn this
path off (``ENABLED``).
On the H200 (session 13) a Gluon forward launch took 51 µs of host instead of 61 (triton 3.6;
53 against 64 with 3.9; probes/fast_launch.py).
"""

from __future__ import annotations

import inspect
import warnings

import torch
import triton

try:
    from triton.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction
except ImportError:  # a Triton without them: every launch takes kernel[grid]
    CompiledKernel = JITFunction = None

# False: every launch takes kernel[grid] (probes/fast_launch.py times both ways). Also set when a
# compiled kernel's launch API differs from the one written against (Triton 3.6 to 3.9).
ENABLED = True
_COMPILED: dict = {}
_COMPILED_MAX = 1024  # keys differ by shape: a long-running process with many shapes starts over
_TAIL_NAMES: dict = {}  # kernel -> its parameters' names and defaults, for a hit's argument list


# A descriptor may carry, under this attribute, an object that stands for its type, element type,
# shape, strides, block and layout (one object per distinct set, never reused for another:
# hopper._descriptor's templates): hashing it is one pointer, where the fields take ~1.5 µs.
LAUNCH_KEY = "_flashtile_launch_key"


class _Unkeyable(Exception):
    """An argument this module cannot key safely: the call takes Triton's own path."""


def _int_key(arg: int) -> tuple:
    """Triton's reading of an int: 1 is a constant; otherwise i32, i64 or u64, and divisible by 16 or not."""
    if arg == 1:
        return (int, 1)
    width = 32 if -2 ** 31 <= arg < 2 ** 31 else 64 if -2 ** 63 <= arg < 2 ** 63 else 65
    return (int, width, arg % 16 == 0)


# Keys of the ints seen, by value: a launch passes 10-20 ints (strides, lengths, counts) that
# repeat from call to call, and a lookup is a fifth of _int_key's arithmetic.
_INT_KEYS: dict = {}
_INT_KEYS_MAX = 4096


def _args_key(args: tuple) -> tuple:
    """The keys of a launch's positional arguments (_arg_key of each), written out for the kinds
    that make up most of them: plain ints, tensors and hopper's descriptors."""
    keys = []
    append = keys.append
    for arg in args:
        kind = type(arg)
        if kind is int:  # (not bool, a subclass of int that Triton reads otherwise)
            key = _INT_KEYS.get(arg)
            if key is None:
                key = _int_key(arg)
                if len(_INT_KEYS) < _INT_KEYS_MAX:
                    _INT_KEYS[arg] = key
            append(key)
        elif kind is torch.Tensor:
            append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif arg is None:  # a constexpr None (an optional pointer left out)
            append(None)
        else:
            token = getattr(arg, LAUNCH_KEY, None)  # a descriptor whose maker vouches for its fields
            base = getattr(arg, "base", None) if token is not None else None
            append((token, base.data_ptr() % 16 == 0) if type(base) is torch.Tensor else _arg_key(arg))
    return tuple(keys)


def _arg_key(arg):
    """What of one launch argument can change the compiled kernel, or finer."""
    if arg is None:  # (a constexpr None to Triton)
        return None
    if isinstance(arg, bool):
        return (bool, arg)
    if isinstance(arg, int):
        return _int_key(arg)
    if isinstance(arg, float):
        return float
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    base = getattr(arg, "base", None)
    token = getattr(arg, LAUNCH_KEY, None)
    if token is not None and isinstance(base, torch.Tensor):  # a descriptor whose maker vouches for the rest
        return (token, base.data_ptr() % 16 == 0)
    if isinstance(base, torch.Tensor) and hasattr(arg, "block_shape"):  # a tensor descriptor
        return (type(arg), base.dtype, base.data_ptr() % 16 == 0, tuple(arg.shape), tuple(arg.strides),
                tuple(arg.block_shape), getattr(arg, "layout", None), getattr(arg, "padding", None),
                getattr(arg, "round_f32_to_tf32", None))
    raise _Unkeyable


def _parameters(kernel) -> tuple:
    """The kernel's parameter names and defaults, in order."""
    names = _TAIL_NAMES.get(kernel)
    if names is None:
        signature = inspect.signature(kernel.fn)
        names = tuple((name, p.default) for name, p in signature.parameters.items())
        _TAIL_NAMES[kernel] = names
    return names


def _fills_every_parameter(kernel, positional: int, constexprs: dict) -> bool:
    """Whether ``args`` and ``constexprs`` give every parameter of the kernel a value (or it has a
    default): not so for a kernel behind triton.heuristics or triton.autotune, which add
    parameters of their own choosing on each call, so such a kernel keeps Triton's path."""
    return all(name in constexprs or default is not inspect.Parameter.empty
               for name, default in _parameters(kernel)[positional:])


def launch(kernel, grid: tuple, *args, check=None, **constexprs) -> None:
    """``kernel[grid](*args, **constexprs)``, through the compiled kernel once Triton has built it
    for an equal key. ``grid``: a tuple of 1 to 3 ints; ``constexprs``: the parameters after
    ``args``, by name (constexprs, num_warps), with ints, bools or strings as values. ``check``:
    a function of the CompiledKernel that raises if the binary must not run; a binary is
    checked before its first launch (built first with ``warmup``), and then kept."""
    # Only a plain JITFunction's compiled kernel is kept: not the interpreter's functions (the CPU
    # suite's launches, which would only pay for a key) nor a heuristics/autotune wrapper.
    if not ENABLED or JITFunction is None or not isinstance(kernel, JITFunction):
        if check is not None:  # (no binary is kept here: each launch is checked)
            check(_built(kernel, grid, args, constexprs))
        kernel[grid](*args, **constexprs)
        return
    # (Before CUDA's first use, e.g. on a machine without a GPU where tests stub the kernels, no
    # launch has happened on any device, so -1 cannot stand for a device a binary was loaded on.)
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else -1
    try:
        key = (kernel, device, _args_key(args), tuple(constexprs.items()))
        compiled = _COMPILED.get(key)
    except (_Unkeyable, TypeError):  # (TypeError: a constexpr value that cannot be hashed)
        key = compiled = None
    if compiled is not None:
        grid3 = (*grid, 1, 1)[:3]
        rest = [constexprs[name] if name in constexprs else default
                for name, default in _parameters(kernel)[len(args):]]
        try:
            compiled[grid3](*args, *rest)
            return
        except (TypeError, AttributeError) as error:  # a Triton whose CompiledKernel launches otherwise
            if _launch_hooks():  # a hook's own error may come after the launch: never launch twice
                raise
            _give_up(error)
    if check is not None:
        check(_built(kernel, grid, args, constexprs))
    result = kernel[grid](*args, **constexprs)
    if hasattr(result, "result"):  # a Triton that compiles asynchronously returns a future
        result = result.result()
    if key is not None and isinstance(result, CompiledKernel) and _fills_every_parameter(kernel, len(args), constexprs):
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[key] = result


def _built(kernel, grid: tuple, args: tuple, constexprs: dict):
    """The CompiledKernel that ``kernel[grid](*args, **constexprs)`` would launch, built (or found
    in Triton's caches) without launching it."""
    compiled = kernel.warmup(*args, grid=grid, **constexprs)
    return compiled.result() if hasattr(compiled, "result") else compiled  # (an asynchronous build's future)


def _launch_hooks() -> bool:
    """Whether a launch hook (a profiler's) is installed: then an error of a launch may be the
    hook's, raised after the kernel ran."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    hooks = (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None))
    # (Triton 3.6+ keeps each as a HookChain, empty unless something added a hook to it.)
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


def _give_up(error: BaseException) -> None:
    """Turn the compiled-kernel path off for this process, with one warning: this Triton's
    CompiledKernel does not launch as written here (its arguments were not taken, so nothing ran)."""
    global ENABLED
    ENABLED = False
    _COMPILED.clear()
    warnings.warn(f"flashtile: launching compiled kernels directly failed with triton {triton.__version__} "
                  f"({type(error).__name__}: {str(error)[:200]}); every launch takes Triton's own path from now on",
                  RuntimeWarning, stacklevel=3)
