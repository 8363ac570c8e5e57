from .base import (OUT_TYPES, READOUT_TYPES, Backbone, Intermediates, PatchEmbed,
                   PlainBackbone, TokenLayout, resize_pos_embed)
from .dino_vim import DinoVim, MambaBlock
from .linear_vit import LinearViT
from .mlla import MLLA, MLLABlock
from .plain_mlla import PlainMLLA

__all__ = ['Backbone', 'DinoVim', 'Intermediates', 'LinearViT', 'MLLA', 'MLLABlock', 'MambaBlock',
           'OUT_TYPES', 'PatchEmbed', 'PlainBackbone', 'PlainMLLA', 'READOUT_TYPES',
           'TokenLayout', 'resize_pos_embed']
