"""``python -m flashtile``: the same command as the ``flashtile`` console script."""

from .cli import main

raise SystemExit(main())
