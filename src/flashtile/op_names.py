"""Python objects handed to the custom ops by name.

``torch.library`` custom ops take tensors, numbers and strings only, so a block mask or
a score modifier crosses into ``flashtile::attention_forward``/``_backward`` as a key
into a registry. The registry holds objects weakly: an object stays findable while the
caller (and the autograd graph, through the context of ``ops._AttentionFunction``) keeps
it alive. Under torch.compile the graph holds only the name: the caller must keep the
object alive until the backward has run (a dead one gives a clear error, not a wrong answer).
"""

from __future__ import annotations

import weakref
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


def constant_under_compile(register: Callable) -> Callable:
    """Mark a module-level ``register`` as a constant-result function for Dynamo.

    Under torch.compile, Dynamo then runs it while tracing and bakes the name into the
    graph: registering is Python a graph cannot hold. The graph guards on the object, so
    another object recompiles (tests/test_mask_mods.py). This is what
    torch.compiler.assume_constant_result sets; calling that would import torch._dynamo (and
    with it Triton) whenever flashtile is imported.
    """
    register._dynamo_marked_constant = True
    return register


class OpNames(Generic[T]):
    """Weak ``key -> object`` registry; ``what`` names the kind of object in errors."""

    def __init__(self, what: str):
        self.what = what
        self._objects: weakref.WeakValueDictionary[str, T] = weakref.WeakValueDictionary()

    def register(self, obj: T, name: str) -> str:
        key = f"{name}@{id(obj)}"
        self._objects[key] = obj
        return key

    def lookup(self, key: str) -> T:
        try:
            return self._objects[key]
        except KeyError:
            raise RuntimeError(f"{self.what} {key!r} is gone: keep the {self.what} alive while its outputs need a "
                               "backward") from None
