"""kernels/fast_launch.py: when a launch may reuse the compiled kernel Triton returned, and when it
must go through ``kernel[grid]`` again. Triton's objects are stood in for by fakes that record
which path each call took (the GPU suite runs the real kernels through it)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from flashtile.kernels import fast_launch


class _FakeCompiled:
    """A compiled kernel: compiled[grid](*every_parameter) records the launch."""

    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("compiled", grid, args))


class _FakeJit:
    """kernel[grid](*args, **constexprs) as Triton's JITFunction: records the call, returns a
    compiled kernel (one object per distinct specialisation would be Triton's; one will do)."""

    def __init__(self):
        self.calls = []
        self.compiled = _FakeCompiled(self.calls)

        def fn(x, n, scale, BLOCK, DEFAULTED=7):  # the kernel's parameters, as inspect sees them
            pass

        self.fn = fn

    def __getitem__(self, grid):
        def run(*args, **constexprs):
            self.calls.append(("jit", grid, args, constexprs))
            return self.compiled
        return run

    def warmup(self, *args, grid, **constexprs):  # the binary, built without a launch
        self.calls.append(("warmup", grid, args, constexprs))
        return self.compiled


@dataclass
class _FakeDescriptor:
    base: torch.Tensor
    shape: list
    strides: list
    block_shape: list
    layout: str


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(fast_launch, "CompiledKernel", _FakeCompiled)
    monkeypatch.setattr(fast_launch, "JITFunction", _FakeJit)
    monkeypatch.setattr(fast_launch, "_COMPILED", {})
    monkeypatch.setattr(fast_launch, "ENABLED", True)
    return _FakeJit()


def _paths(kernel):
    return [call[0] for call in kernel.calls]


def test_a_repeated_launch_reuses_the_compiled_kernel_with_every_parameter_in_order(kernel):
    x = torch.randn(64)
    fast_launch.launch(kernel, (3,), x, 100, 0.5, BLOCK=64)
    y = torch.randn(64)  # another tensor, same dtype and alignment
    fast_launch.launch(kernel, (3,), y, 100, 0.25, BLOCK=64)
    assert _paths(kernel) == ["jit", "compiled"]
    _, grid, args = kernel.calls[1]
    assert grid == (3, 1, 1)  # the runner indexes three grid dims
    assert args[0] is y and args[1:] == (100, 0.25, 64, 7)  # the default filled in by name


@pytest.mark.parametrize("change", ["int", "int-value", "one", "wide", "constexpr", "dtype", "alignment",
                                    "grid-only"])
def test_anything_that_can_change_the_binary_goes_back_to_triton(kernel, change):
    x = torch.randn(64)
    fast_launch.launch(kernel, (3,), x, 96, 0.5, BLOCK=64)
    args, constexprs, grid = [x, 96, 0.5], dict(BLOCK=64), (3,)
    if change == "int":
        args[1] = 97  # Triton specialises ints by divisibility by 16 (and 1, and width)
    elif change == "int-value":
        args[1] = 112  # another multiple of 16: the same binary, the value passed at launch
    elif change == "one":
        args[1] = 1  # a constant to Triton
    elif change == "wide":
        args[1] = 2 ** 32  # 64-bit
    elif change == "constexpr":
        constexprs["BLOCK"] = 128
    elif change == "dtype":
        args[0] = x.half()
    elif change == "alignment":
        args[0] = torch.randn(65)[1:]  # 4 bytes past a 16-byte boundary
    else:
        grid = (5,)  # the grid is not part of the binary
    fast_launch.launch(kernel, grid, *args, **constexprs)
    assert _paths(kernel) == ["jit", "compiled" if change in ("grid-only", "int-value") else "jit"]


def test_descriptors_are_keyed_by_shape_strides_block_and_layout(kernel):
    t = torch.randn(4, 64)

    def descriptor(tensor, block=(16, 64), layout="swizzle128"):
        return _FakeDescriptor(tensor, list(tensor.shape), list(tensor.stride()), list(block), layout)

    fast_launch.launch(kernel, (1,), descriptor(t), 1, 1.0, BLOCK=16)
    fast_launch.launch(kernel, (1,), descriptor(torch.randn(4, 64)), 1, 1.0, BLOCK=16)  # same key
    fast_launch.launch(kernel, (1,), descriptor(t, block=(32, 64)), 1, 1.0, BLOCK=16)
    fast_launch.launch(kernel, (1,), descriptor(t, layout="swizzle64"), 1, 1.0, BLOCK=16)
    fast_launch.launch(kernel, (1,), descriptor(torch.randn(8, 128)[:, :64]), 1, 1.0, BLOCK=16)  # strides
    assert _paths(kernel) == ["jit", "compiled", "jit", "jit", "jit"]


def test_an_argument_it_cannot_key_always_takes_triton(kernel):
    for arg in ((1, 2), (1, 2)):  # a tuple argument: Triton specialises each member; not keyed here
        fast_launch.launch(kernel, (1,), arg, 1, 1.0, BLOCK=16)
    assert _paths(kernel) == ["jit", "jit"] and not fast_launch._COMPILED


def test_none_is_keyed_as_triton_reads_it(kernel):
    for _ in range(2):  # (None, e.g. an absent descriptor, is a constexpr None to Triton)
        fast_launch.launch(kernel, (1,), None, 1, 1.0, BLOCK=16)
    assert _paths(kernel) == ["jit", "compiled"]


def test_a_check_sees_each_binary_before_its_first_launch_and_can_stop_it(kernel):
    # (tma_reduce_ptx.check: a binary whose PTX rewrite did not take must never run)
    seen = []
    x = torch.randn(64)
    for _ in range(2):
        fast_launch.launch(kernel, (2,), x, 100, 0.5, BLOCK=64, check=seen.append)
    assert _paths(kernel) == ["warmup", "jit", "compiled"] and seen == [kernel.compiled]
    assert kernel.calls[0][1:] == ((2,), (x, 100, 0.5), {"BLOCK": 64})  # the launch's own arguments

    def refuse(compiled):
        raise RuntimeError("this binary must not run")

    kernel.calls.clear()
    with pytest.raises(RuntimeError, match="must not run"):  # a new key (BLOCK): checked, refused
        fast_launch.launch(kernel, (2,), x, 100, 0.5, BLOCK=32, check=refuse)
    assert _paths(kernel) == ["warmup"]  # built, never launched
    fast_launch.ENABLED = False  # Triton's path on every call: checked on every call (monkeypatch restores it)
    with pytest.raises(RuntimeError, match="must not run"):
        fast_launch.launch(kernel, (2,), x, 100, 0.5, BLOCK=64, check=refuse)
    assert _paths(kernel) == ["warmup", "warmup"]


def test_what_triton_did_not_compile_is_not_kept(kernel):
    kernel.compiled = object()  # e.g. a test's stub kernel, which returns no compiled kernel
    x = torch.randn(64)
    for _ in range(2):
        fast_launch.launch(kernel, (1,), x, 1, 1.0, BLOCK=16)
    assert _paths(kernel) == ["jit", "jit"] and not fast_launch._COMPILED


def test_a_compiled_kernel_that_launches_otherwise_turns_the_path_off_with_a_warning(kernel):
    class _OtherApi(_FakeCompiled):
        def __getitem__(self, grid):
            raise AttributeError("'CompiledKernel' object has no attribute 'run'")

    kernel.compiled = _OtherApi(kernel.calls)
    fast_launch.CompiledKernel = _OtherApi  # (the fixture restores the module's name)
    x = torch.randn(64)
    fast_launch.launch(kernel, (1,), x, 1, 1.0, BLOCK=16)
    with pytest.warns(RuntimeWarning, match="launching compiled kernels directly failed"):
        fast_launch.launch(kernel, (1,), x, 1, 1.0, BLOCK=16)  # the hit fails: Triton's path launches it
    fast_launch.launch(kernel, (1,), x, 1, 1.0, BLOCK=16)
    assert _paths(kernel) == ["jit", "jit", "jit"] and not fast_launch.ENABLED


def test_a_kernel_given_parameters_by_a_wrapper_keeps_tritons_path(kernel):
    # triton.heuristics / triton.autotune fill in parameters the caller does not pass (here BLOCK):
    # the compiled kernel's argument list could not be completed from the call.
    x = torch.randn(64)
    for _ in range(2):
        fast_launch.launch(kernel, (1,), x, 1, 1.0)
    assert _paths(kernel) == ["jit", "jit"] and not fast_launch._COMPILED


def test_ints_with_one_key_are_one_specialisation_of_the_installed_triton():
    # The key reads ints as Triton does (1, divisible by 16, 32/64-bit): a Triton that
    # specialised on more would make a hit run a binary built for another class of value.
    libtriton = pytest.importorskip("triton._C.libtriton")
    from triton.backends.compiler import BaseBackend

    def triton_class(x):
        return libtriton.native_specialize_impl(BaseBackend, x, False, True, True)

    values = [0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 48, 64, 96, 100, 128, 1000, 1024, 4096, 65535, 65536,
              2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16, 2 ** 40 + 3, 2 ** 62, 2 ** 63 - 1, 2 ** 63,
              -1, -16, -17, -(2 ** 31), -(2 ** 31) - 1]
    seen = {}
    for x in values:
        seen.setdefault(fast_launch._arg_key(x), set()).add(triton_class(x))
    assert all(len(classes) == 1 for classes in seen.values()), seen


def test_a_kernel_behind_autotune_or_heuristics_keeps_tritons_path(kernel):
    class _Wrapped(_FakeJit):  # e.g. triton.heuristics: .fn is the inner kernel, (*args, **kwargs)
        pass

    wrapped = _Wrapped()
    fast_launch.JITFunction = type("OnlyPlainJit", (), {})  # (the fixture restores the module's name)
    x = torch.randn(64)
    for _ in range(2):
        fast_launch.launch(wrapped, (1,), x, 1, 1.0, BLOCK=16)
    assert _paths(wrapped) == ["jit", "jit"] and not fast_launch._COMPILED


def test_with_a_launch_hook_an_error_of_the_launch_is_raised_not_launched_again(kernel, monkeypatch):
    class _HookFails(_FakeCompiled):
        def __getitem__(self, grid):
            def run(*args):
                self.calls.append(("compiled", grid, args))
                raise TypeError("the exit hook's own error, after the kernel ran")
            return run

    kernel.compiled = _HookFails(kernel.calls)
    fast_launch.CompiledKernel = _HookFails
    monkeypatch.setattr(fast_launch, "_launch_hooks", lambda: True)
    x = torch.randn(64)
    fast_launch.launch(kernel, (1,), x, 1, 1.0, BLOCK=16)
    with pytest.raises(TypeError, match="exit hook"):
        fast_launch.launch(kernel, (1,), x, 1, 1.0, BLOCK=16)
    assert _paths(kernel) == ["jit", "compiled"] and fast_launch.ENABLED


@pytest.mark.skipif(__import__("flashtile.kernels.hopper", fromlist=["_gluon"])._gluon() is None,
                    reason="this Triton has no Gluon Hopper descriptors")
def test_hoppers_descriptors_carry_one_launch_key_per_template():
    from flashtile.kernels import hopper

    q = torch.randn(2, 300, 4, 128, dtype=torch.bfloat16).transpose(1, 2)
    first, again = hopper._tile_descriptor(q, 64), hopper._tile_descriptor(q.clone().transpose(1, 2).contiguous()
                                                                           .transpose(1, 2), 64)
    other_box, other_view = hopper._tile_descriptor(q, 128), hopper._tile_descriptor(q.contiguous(), 64)
    token = getattr(first, fast_launch.LAUNCH_KEY)
    assert getattr(again, fast_launch.LAUNCH_KEY) is token  # same shape, strides, box and layout
    assert getattr(other_box, fast_launch.LAUNCH_KEY) is not token
    assert getattr(other_view, fast_launch.LAUNCH_KEY) is not token  # other strides
    assert fast_launch._arg_key(first) == (token, True)


def test_a_launchs_arguments_are_keyed_as_each_one_alone():
    # _args_key writes out ints, tensors and keyed descriptors for speed: it must give what
    # _arg_key gives each argument, bools and ints that compare equal (True == 1) included.
    @dataclass
    class Keyed:
        base: torch.Tensor

    keyed = Keyed(torch.randn(8))
    setattr(keyed, fast_launch.LAUNCH_KEY, object())
    unaligned = torch.randn(65)[1:]
    args = (1, True, 0, False, 16, 17, -16, 2 ** 31, 2 ** 63, None, 0.5, torch.randn(4), unaligned,
            torch.nn.Parameter(torch.randn(4)), keyed, _FakeDescriptor(unaligned, [64], [1], [16], "x"))
    for _ in range(2):  # the ints' keys computed, then looked up
        assert fast_launch._args_key(args) == tuple(map(fast_launch._arg_key, args))
    assert fast_launch._args_key((1,)) != fast_launch._args_key((True,))
    with pytest.raises(fast_launch._Unkeyable):
        fast_launch._args_key((1, (2, 3)))
