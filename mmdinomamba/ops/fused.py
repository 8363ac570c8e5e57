"""Dispatch between the PyTorch reference ops and the fused Triton kernels.

The Triton kernels (:mod:`mmdinomamba.ops.triton`) run on CUDA tensors when
Triton imports; everything else (CPU, float64, no Triton) takes the PyTorch
path, which is the ground truth. Set the environment variable
``MMDINOMAMBA_DISABLE_TRITON=1`` to force the PyTorch path on CUDA too.
"""
import functools
import importlib.util
import os
from typing import Optional, Tuple

import torch

from .norm import rms_norm

Tensor = torch.Tensor

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.lru_cache(maxsize=None)
def _triton_importable() -> bool:
    if os.environ.get('MMDINOMAMBA_DISABLE_TRITON', '0') == '1':
        return False
    if not torch.cuda.is_available() or importlib.util.find_spec('triton') is None:
        return False
    try:
        import mmdinomamba.ops.triton  # noqa: F401
    except Exception:  # a Triton too old for the kernels, or a broken install
        return False
    return True


@torch.compiler.assume_constant_result  # torch.compile reads it once, no graph break
def triton_available() -> bool:
    """True when CUDA is usable, Triton imports and it is not disabled."""
    return _triton_importable()


def triton_takes(t: Tensor) -> bool:
    """Whether the kernels can take tensor ``t``: CUDA, a Triton dtype, Triton here."""
    return t.is_cuda and t.dtype in TRITON_DTYPES and triton_available()


def use_triton(t: Tensor) -> bool:
    """Whether the fused kernels take tensor ``t`` (:func:`triton_takes`). Never under
    ``torch.compile``, which fuses the PyTorch ops itself; only the mixer core, which
    it cannot write as one kernel, stays fused there (a custom op:
    :func:`mmdinomamba.ops.uses_fused_core`)."""
    return not torch.compiler.is_compiling() and triton_takes(t)


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a matmul after a norm computes in: autocast's, else the weight's."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def add_rms_norm(h: Tensor, residual: Optional[Tensor], weight: Tensor,
                 eps: float = 1e-5, scale: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Tensor]:
    """The pre-norm step of a block: ``residual = scale * h + residual``, then RMSNorm.

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
        and its RMSNorm (..., dim), in
        the dtype the next matmul computes in (the PyTorch path returns the
        weight's dtype and leaves the cast to autocast: same values).
    """
    if scale is not None and (h.dim() < 2 or scale.shape != h.shape[:1]):
        raise ValueError(f'add_rms_norm: scale must have shape ({h.shape[0]},) for h of '
                         f'shape {tuple(h.shape)}, got {tuple(scale.shape)}')
    if use_triton(h):
        from .triton import add_rms_norm_triton
        return add_rms_norm_triton(h, residual, weight, eps, compute_dtype(weight), scale)
    h = h.to(torch.promote_types(h.dtype, torch.float32))  # float64 stays float64
    if scale is not None:
        h = h * scale.to(h.dtype).view(-1, *(1, ) * (h.dim() - 1))
    residual = h if residual is None else residual + h
    return residual, rms_norm(residual.to(weight.dtype), weight, eps)
