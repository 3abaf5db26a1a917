"""Triton twins of the torch functions a score_mod may call.

A user's ``score_mod`` is written once against torch (``torch.where(...)``) and runs
as is on the reference backend; in the kernels its ``torch`` name is rebound to this
module, so ``torch.where`` calls :func:`where` below. Each twin is a ``triton.jit``
function (not a bare ``tl`` builtin), which both the compiler and Triton's
interpreter can call from another jitted function.
"""

import triton
import triton.language as tl

from .common import _tanh


@triton.jit
def where(condition, x, y):
    return tl.where(condition, x, y)


@triton.jit
def abs(x):  # noqa: A001 - the torch name is the point
    return tl.abs(x)


@triton.jit
def exp(x):
    return tl.exp(x)


@triton.jit
def log(x):
    return tl.log(x)


@triton.jit
def sqrt(x):
    return tl.sqrt(x)


@triton.jit
def maximum(x, y):
    return tl.maximum(x, y)


@triton.jit
def minimum(x, y):
    return tl.minimum(x, y)


@triton.jit
def tanh(x):
    return _tanh(x)
