"""Models: everything here but ``selfsup`` needs torch, einops and mmengine only."""
from .backbones import MLLA, DinoVim, LinearViT, PlainMLLA
from .heads import DINOHead
from .losses import DINOLoss
from .mixers import LinearAttention, LinearAttentionMixer, SSDMixer
from .necks import ConcatNeck

__all__ = ['ConcatNeck', 'DINOHead', 'DINOLoss', 'DinoVim', 'LinearAttention',
           'LinearAttentionMixer', 'LinearViT', 'MLLA', 'PlainMLLA', 'SSDMixer']
