"""RMSNorm, the gated RMSNorm of Mamba-2, a block's residual add + RMSNorm, and a
residual add + LayerNorm (MLLA's blocks), computed in at least fp32 like
mamba-ssm's kernels."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .spec import at_least_float32, float32_or_wider

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
    xf = at_least_float32(x)
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
    yf = at_least_float32(y)
    gated = yf * F.silu(z.to(yf.dtype))
    return rms_norm(gated, weight, eps, group_size).to(y.dtype)


def add_rms_norm_ref(h: Tensor, residual: Optional[Tensor], weight: Tensor,
                     eps: float = 1e-5, scale: Optional[Tensor] = None
                     ) -> Tuple[Tensor, Tensor]:
    """The pre-norm step of a block: ``residual = scale * h + residual``, then RMSNorm.

    The PyTorch twin of :func:`mmdinomamba.ops.triton.add_rms_norm_triton`
    (:func:`mmdinomamba.ops.backend.add_rms_norm` picks one).

    Args:
        h (Tensor): (batch, ..., dim), the previous block's output (or the tokens).
        residual (Tensor, optional): like h, the stream (float32, or float64
            for float64 inputs); None for the first block, whose stream starts
            as ``h``.
        weight (Tensor): (dim,) RMSNorm scale.
        eps (float): RMSNorm eps. Defaults to 1e-5.
        scale (Tensor, optional): (batch,) per-sample factor of ``h``, applied in
            the stream's dtype: stochastic depth's 0 or ``1 / keep``
            (:meth:`mmdinomamba.models.utils.DropPath.sample_scale`). None means 1.

    Returns:
        tuple: the new stream (..., dim) (float32, float64 for float64 inputs)
        and its RMSNorm (..., dim) in the weight's dtype (autocast casts it for
        the matrix product that follows).
    """
    h = at_least_float32(h)
    if scale is not None:
        h = h * scale.to(h.dtype).view(-1, *(1, ) * (h.dim() - 1))
    residual = h if residual is None else residual + h
    return residual, rms_norm(residual.to(weight.dtype), weight, eps)


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


def layer_norm_out_dtype(residual_dtype: torch.dtype,
                         device: torch.device) -> torch.dtype:
    """The dtype of a LayerNorm's output before a matmul: autocast's where it is on
    for ``device`` (what the matmul casts its input to anyway), else the residual's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return residual_dtype


def add_layer_norm_ref(x: Tensor, h: Optional[Tensor] = None,
                       weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                       eps: float = 1e-5, out_dtype: Optional[torch.dtype] = None
                       ) -> Tuple[Tensor, Tensor]:
    """A residual add, then LayerNorm over the last axis, statistics in float32::

        residual = x + h          (x when h is None; PyTorch's dtype promotion)
        mu       = mean(residual)
        var      = mean((residual - mu)^2)
        out      = (residual - mu) / sqrt(var + eps) * weight + bias

    The PyTorch twin of :func:`mmdinomamba.ops.triton.add_layer_norm_triton`
    (:func:`mmdinomamba.ops.backend.add_layer_norm` picks one;
    :class:`mmdinomamba.models.mixers.AddLayerNorm` is the module). In float32 it
    is ``nn.LayerNorm`` after the add, to the bit.

    Args:
        x (Tensor): (..., dim), the residual stream.
        h (Tensor, optional): like x, the branch added to it (e.g. CPE's
            convolution). None: no add.
        weight (Tensor, optional): (dim,); None means 1.
        bias (Tensor, optional): (dim,); None means 0.
        eps (float): added to the variance. Defaults to 1e-5.
        out_dtype (torch.dtype, optional): dtype of the normalised output.
            Defaults to the residual's.

    Returns:
        tuple: the residual (..., dim) (``x`` itself when h is None) and its
        LayerNorm (..., dim) in ``out_dtype``.
    """
    residual = x if h is None else x + h
    wide = float32_or_wider(residual.dtype)
    out = F.layer_norm(_cast(residual, wide), residual.shape[-1:],
                       None if weight is None else _cast(weight, wide),
                       None if bias is None else _cast(bias, wide), eps)
    return residual, _cast(out, out_dtype or residual.dtype)


def _cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)`` without an operator call when ``t`` already has it (the
    host's time of an eager step follows the operators it issues)."""
    return t if t.dtype == dtype else t.to(dtype)

