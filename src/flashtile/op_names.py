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
from typing import Generic, TypeVar

T = TypeVar("T")


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
