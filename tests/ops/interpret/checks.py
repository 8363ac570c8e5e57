"""What the interpreter tests compare with: a norm-relative error and its bounds.

Everything runs in float32 with IEEE dots, so the error against a float64
reference is float32 rounding (about 1e-7 here): :data:`TOL` catches any wrong
term. Results rounded to float16 once or twice on the way (unit roundoff 2^-11,
about 4.9e-4) are held to :data:`HALF_TOL`.
"""
import torch

TOL = 1e-5
HALF_TOL = 2e-3


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def bits(a, b) -> float:
    """The largest absolute difference over pairs of tensors (0.0: the same bits)."""
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def assert_close_all(errors: dict, tol: float = TOL) -> None:
    """Every named error below ``tol``; the message lists those that are not."""
    bad = {k: v for k, v in errors.items() if not v < tol}
    assert not bad, bad
