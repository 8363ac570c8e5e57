"""Concatenate per-layer features: the linear-probe readout of DINO."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule

Tensor = torch.Tensor


class ConcatNeck(BaseModule):
    """``(f_1, ..., f_n)`` of shape (batch, C) each -> ``(cat(f_1..f_n),)``.

    This is DINO's linear-probe input: the [CLS] outputs of the last n blocks,
    concatenated along channels. ``in_channels``, when given, is checked against
    the incoming features, so a wrong ``out_indices``/head width fails early.

    Args:
        in_channels (int, optional): total width expected after concatenation.
        with_bn (bool): normalise the concatenation with a parameter-free
            BatchNorm (MAE's linear-probe convention), for backbones whose
            intermediate outputs are not normalised. Defaults to False.
        init_cfg (dict, optional): mmengine initialisation config.
    """

    def __init__(self, in_channels: Optional[int] = None, with_bn: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if with_bn and in_channels is None:
            raise ValueError('ConcatNeck: with_bn=True needs in_channels')
        self.in_channels = in_channels
        self.bn = nn.BatchNorm1d(in_channels, affine=False, eps=1e-6) if with_bn \
            else nn.Identity()

    def forward(self, inputs: Sequence[Tensor]) -> Tuple[Tensor]:
        """Args: inputs: n tensors of (batch, C_i). Returns: ((batch, sum C_i),)."""
        if not isinstance(inputs, (tuple, list)) or not inputs \
                or any(x.dim() != 2 for x in inputs):
            shapes = [tuple(x.shape) for x in inputs] if isinstance(
                inputs, (tuple, list)) else type(inputs)
            raise ValueError('ConcatNeck: expected a tuple of (batch, channels) '
                             f"features (out_type='cls_token'), got {shapes}")
        x = torch.cat(list(inputs), dim=1)
        if self.in_channels is not None and x.shape[1] != self.in_channels:
            raise ValueError(f'ConcatNeck: got {x.shape[1]} channels from '
                             f'{len(inputs)} features, expected {self.in_channels}')
        return (self.bn(x), )
