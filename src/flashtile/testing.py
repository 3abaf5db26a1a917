"""The numerical contract, shared by the test suite, the demo and users' own tests.

flashtile's result is judged against the float64 oracle, with PyTorch-style attention
in the input dtype as the yardstick (flash-attn's rule): with ``err_pt`` the max error
of the low-precision baseline against the oracle, flashtile passes when its own max
error is at most ``2·err_pt + 1e-5`` for outputs and ``3·err_pt + 1e-5`` for gradients.
"""

from __future__ import annotations

import torch

ABS_SLACK = 1e-5
OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 3.0


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max |actual - expected| in float64; equal infinities count as 0, NaN as inf."""
    a, e = actual.detach().double(), expected.detach().double()
    if a.shape != e.shape:
        raise ValueError(f"actual: expected shape {tuple(e.shape)}, got {tuple(a.shape)}")
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    diff = torch.where(same_inf, 0.0, (a - e).abs())
    diff = torch.where(torch.isnan(diff), float("inf"), diff)
    return float(diff.max()) if diff.numel() else 0.0


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual - expected‖ / ‖expected‖ over finite entries, in float64."""
    a, e = actual.detach().double(), expected.detach().double()
    finite = torch.isfinite(e)
    denom = e[finite].norm()
    return float((a[finite] - e[finite]).norm() / denom) if denom > 0 else float((a[finite] - e[finite]).norm())


def tolerance(err_pt: float, *, grad: bool = False) -> float:
    return (GRAD_FACTOR if grad else OUTPUT_FACTOR) * err_pt + ABS_SLACK


def assert_close_to_oracle(name: str, actual, oracle, baseline, *, grad: bool = False) -> None:
    """Assert the contract: ``max_error(actual, oracle) <= factor·max_error(baseline, oracle) + 1e-5``.

    actual: flashtile's result; oracle: the float64 truth; baseline: the same quantity
    computed by standard attention in the input dtype.
    """
    err = max_error(actual, oracle)
    err_pt = max_error(baseline, oracle)
    bound = tolerance(err_pt, grad=grad)
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} against the float64 oracle exceeds {bound:.3e} "
            f"({GRAD_FACTOR if grad else OUTPUT_FACTOR:g} × PyTorch's {err_pt:.3e} + {ABS_SLACK:g})"
        )
