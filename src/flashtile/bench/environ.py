"""Environment variables set for the length of a block, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` inside the block; afterwards each of those names has
    its earlier value again, or is unset if it was. Other variables are left alone (unlike
    ``unittest.mock.patch.dict``, which restores the whole environment, undoing what the
    block's own code set there)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
