"""Models: mixers and backbones need torch, einops and mmengine only."""
from .backbones import DinoVim, LinearViT
from .mixers import LinearAttention, SSDMixer

__all__ = ['DinoVim', 'LinearAttention', 'LinearViT', 'SSDMixer']
