"""RMSNorm and the gated RMSNorm of Mamba-2, computed in fp32 like mamba-ssm's kernels."""
from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float = 1e-5,
             group_size: Optional[int] = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (or groups of it).

    Args:
        x (Tensor): (..., dim).
        weight (Tensor, optional): (dim,).
        eps (float): added to the mean square. Defaults to 1e-5.
        group_size (int, optional): normalise each run of ``group_size``
            channels on its own. Defaults to the whole last axis.

    Returns:
        Tensor: (..., dim) in x's dtype, computed in at least fp32.
    """
    dim = x.shape[-1]
    group_size = group_size or dim
    if dim % group_size != 0:
        raise ValueError(f'rms_norm: group_size {group_size} must divide the '
                         f'last dimension {dim}')
    xf = x.float() if x.dtype not in (torch.float32, torch.float64) else x
    xg = xf.unflatten(-1, (dim // group_size, group_size))
    y = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    if weight is not None:
        y = y * weight.to(y.dtype)
    return y.to(x.dtype)


def gated_rms_norm(y: Tensor, z: Tensor, weight: Optional[Tensor],
                   eps: float = 1e-5, group_size: Optional[int] = None) -> Tensor:
    """Mamba-2's output norm with the gate applied first: ``rms_norm(y * silu(z))``.

    Args:
        y (Tensor): (..., dim), the SSD output.
        z (Tensor): (..., dim), the gate branch of the input projection.
        weight (Tensor, optional): (dim,).
        eps (float): Defaults to 1e-5.
        group_size (int, optional): channels per norm group (``dim // ngroups``).

    Returns:
        Tensor: (..., dim) in y's dtype.
    """
    if z.shape != y.shape:
        raise ValueError(f'gated_rms_norm: `z` must have the shape of y '
                         f'{tuple(y.shape)}, got {tuple(z.shape)}')
    yf = y.float() if y.dtype not in (torch.float32, torch.float64) else y
    gated = yf * F.silu(z.to(yf.dtype))
    return rms_norm(gated, weight, eps, group_size).to(y.dtype)


class RMSNorm(torch.nn.Module):
    """RMSNorm with a learnable scale, parameter name ``weight`` (as in mamba-ssm).

    Args:
        dim (int): normalised width.
        eps (float): Defaults to 1e-5.
        group_size (int, optional): see :func:`rms_norm`.
    """

    def __init__(self, dim: int, eps: float = 1e-5,
                 group_size: Optional[int] = None, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = torch.nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor, z: Optional[Tensor] = None) -> Tensor:
        if z is None:
            return rms_norm(x, self.weight, self.eps, self.group_size)
        return gated_rms_norm(x, z, self.weight, self.eps, self.group_size)

    def extra_repr(self) -> str:
        return f'{self.weight.shape[0]}, eps={self.eps}, group_size={self.group_size}'
