"""DINO projection head: MLP, L2-normalised bottleneck, weight-normalised prototypes.

"Emerging Properties in Self-Supervised Vision Transformers" (Caron et al., ICCV
2021), https://arxiv.org/abs/2104.14294, Sec. 3.1 and App. (projection head).
"""
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch.nn.utils.parametrizations import weight_norm

Tensor = torch.Tensor


class DINOHead(BaseModule):
    """The DINO head: ``x -> MLP -> L2-normalise -> weight-normalised linear``.

    The MLP has ``num_layers`` linear layers (hidden width ``hidden_channels``,
    GELU between them, an optional BatchNorm before each GELU) and ends in the
    ``bottleneck_channels`` bottleneck. The output layer ``last_layer`` has no
    bias and is weight-normalised: its weight is ``g * v / ||v||`` per output row.
    With ``norm_last_layer`` the gains ``g`` are fixed to 1, so every prototype is
    a unit vector and the logits are cosine similarities.

    Args:
        in_channels (int): backbone feature width.
        out_channels (int): number of prototypes K. Defaults to 65536.
        hidden_channels (int): MLP width. Defaults to 2048.
        bottleneck_channels (int): Defaults to 256.
        num_layers (int): linear layers in the MLP, >= 1. Defaults to 3.
        use_bn (bool): BatchNorm1d after each hidden linear layer. Defaults to False.
        norm_last_layer (bool): fix the output-layer gains to 1. Defaults to True.
        init_cfg (dict, optional): mmengine initialisation config.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int = 65536,
                 hidden_channels: int = 2048,
                 bottleneck_channels: int = 256,
                 num_layers: int = 3,
                 use_bn: bool = False,
                 norm_last_layer: bool = True,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if num_layers < 1:
            raise ValueError(f'DINOHead: num_layers must be >= 1, got {num_layers}')
        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + \
            [bottleneck_channels]
        layers: List[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(nn.Linear(c_in, c_out))
            if i < num_layers - 1:
                if use_bn:
                    layers.append(nn.BatchNorm1d(c_out))
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        self.norm_last_layer = norm_last_layer
        self.last_layer = weight_norm(
            nn.Linear(bottleneck_channels, out_channels, bias=False))
        self._init_mlp()
        gain = self.last_layer.parametrizations.weight.original0
        with torch.no_grad():
            gain.fill_(1.0)
        gain.requires_grad = not norm_last_layer

    def _init_mlp(self):
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (Tensor): (batch, in_channels). Returns: (batch, out_channels) logits."""
        if x.dim() != 2:
            raise ValueError(f'DINOHead: expected (batch, channels) features, got '
                             f'shape {tuple(x.shape)}')
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x)
