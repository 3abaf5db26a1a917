"""``flashtile bench``: flashtile against every attention a user could pick instead.

    harness    the grid (the field's convention), timing, the run loop, first-call cost
    providers  one adapter per implementation (flashtile, SDPA backends, FlexAttention,
               naive attention, flash-attn)
    scenarios  what each case computes (dense, sliding-window, document; later varlen, decode)
    report     console tables, JSON, PNG plots
    cli        the command's flags; ``main`` also backs ``benchmarks/run_bench.py``

Importing this package imports neither Triton nor matplotlib and queries no GPU.
"""

from .harness import Case, Grid, Measurement, Timer, flops, measure, run_grid
from .providers import PROVIDERS, Provider, Unsupported
from .scenarios import SCENARIOS, Scenario

__all__ = [
    "Case", "Grid", "Measurement", "Timer", "flops", "measure", "run_grid",
    "PROVIDERS", "Provider", "Unsupported", "SCENARIOS", "Scenario",
]
