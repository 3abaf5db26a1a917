"""Environment variables set for the length of a block, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` inside the block (None: unset that name); afterwards
    each of those names has its earlier value again, or is unset if it was. Other variables are
    left alone (unlike ``unittest.mock.patch.dict``, which restores the whole environment,
    undoing what the block's own code set there)."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        _apply(values)
        yield
    finally:
        _apply(saved)


def _apply(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
