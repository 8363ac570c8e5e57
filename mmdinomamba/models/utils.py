"""Small building blocks shared by the backbones and mixers (torch only)."""
import math

import torch
import torch.nn as nn

Tensor = torch.Tensor


class Mlp(nn.Module):
    """Two linear maps with a GELU between: (..., dim) -> (..., hidden) -> (..., dim)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


def init_dt_bias(nheads: int, dt_min: float, dt_max: float, floor: float,
                 device=None, dtype=None) -> Tensor:
    """A (nheads,) bias whose softplus is log-uniform in [dt_min, dt_max], clamped
    below at ``floor`` (the initial step of an SSD or a forget gate).

    softplus^-1(dt) = dt + log(1 - exp(-dt)); see
    https://github.com/pytorch/pytorch/issues/72759.
    """
    dt = torch.exp(torch.rand(nheads, device=device) *
                   (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp(min=floor)
    return (dt + torch.log(-torch.expm1(-dt))).to(dtype)


class DropPath(nn.Module):
    """Stochastic depth: zero a sample's residual branch with probability ``p``.

    Surviving samples are scaled by ``1 / (1 - p)`` so the expectation is kept.
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f'DropPath: p must be in [0, 1), got {p}')
        self.p = p

    def sample_scale(self, x: torch.Tensor):
        """Per-sample factors (batch,) float32, 0 or ``1 / (1 - p)``, to multiply
        the branch ``x`` by (None when nothing is dropped: eval mode or p = 0).
        Lets a fused kernel apply them (:func:`mmdinomamba.ops.add_rms_norm`)."""
        if self.p == 0.0 or not self.training:
            return None
        keep = 1.0 - self.p
        return torch.empty(x.shape[0], device=x.device).bernoulli_(keep) / keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.sample_scale(x)
        if scale is None:
            return x
        # in float32 (or x's wider dtype), rounded once: 1 / keep itself is not
        # exact in bfloat16
        return (x * scale.view(-1, *(1, ) * (x.dim() - 1))).to(x.dtype)

    def extra_repr(self) -> str:
        return f'p={self.p}'


def drop_path_or_identity(p: float) -> nn.Module:
    return DropPath(p) if p > 0 else nn.Identity()


def linear_rates(last: float, n: int) -> list:
    """``n`` rates rising linearly from 0 to ``last`` (stochastic-depth rule)."""
    return [last * i / (n - 1) if n > 1 else 0.0 for i in range(n)]
