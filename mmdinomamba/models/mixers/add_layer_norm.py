"""A residual add + LayerNorm as a module: MLLA's pre-norm step, with CPE's add."""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from mmdinomamba.ops import add_layer_norm

Tensor = torch.Tensor


class AddLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last axis with a residual add fused in front:
    ``norm(x, h)`` returns ``(x + h, LayerNorm(x + h))``
    (:func:`mmdinomamba.ops.add_layer_norm_ref`), ``norm(x)`` ``LayerNorm(x)``
    as ``nn.LayerNorm`` does; by one Triton kernel on CUDA
    (:func:`mmdinomamba.ops.backend.add_layer_norm`).

    The parameters are ``nn.LayerNorm``'s (``weight``, ``bias``), and so are the
    state dict and ``isinstance(m, nn.LayerNorm)``. The output is in autocast's
    dtype where autocast is on, else in the residual's
    (:func:`mmdinomamba.ops.norm.layer_norm_out_dtype`); the residual keeps the
    dtype of ``x + h``. On the CPU, in float64 and under ``torch.compile`` the
    PyTorch twin runs: ``nn.LayerNorm`` after the add, to the bit in float32.

    Args:
        dim (int): the normalised width.
        eps (float): Defaults to 1e-5.
    """

    def __init__(self, dim: int, eps: float = 1e-5, **kwargs):
        super().__init__(dim, eps=eps, **kwargs)

    def forward(self, x: Tensor, h: Optional[Tensor] = None
                ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Args: x (Tensor): (..., dim); h (Tensor, optional): like x.

        Returns:
            Tensor or tuple: without h, the LayerNorm of x (..., dim); with h, the
            residual ``x + h`` and its LayerNorm.
        """
        residual, out = add_layer_norm(x, h, self.weight, self.bias, self.eps)
        return out if h is None else (residual, out)
