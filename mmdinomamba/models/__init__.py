"""Models: everything here but ``selfsup`` needs torch, einops and mmengine only."""
from .backbones import DinoVim, LinearViT
from .heads import DINOHead
from .losses import DINOLoss
from .mixers import LinearAttention, SSDMixer
from .necks import ConcatNeck

__all__ = ['ConcatNeck', 'DINOHead', 'DINOLoss', 'DinoVim', 'LinearAttention',
           'LinearViT', 'SSDMixer']
