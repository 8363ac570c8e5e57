from .base import OUT_TYPES, PatchEmbed, PlainBackbone, TokenLayout, resize_pos_embed
from .dino_vim import DinoVim, MambaBlock
from .linear_vit import LinearViT

__all__ = ['DinoVim', 'LinearViT', 'MambaBlock', 'OUT_TYPES', 'PatchEmbed',
           'PlainBackbone', 'TokenLayout', 'resize_pos_embed']
