"""Models: everything here but ``selfsup`` needs torch, einops and mmengine only."""
from .backbones import DinoVim, LinearViT
from .heads import DINOHead
from .losses import DINOLoss
from .mixers import LinearAttention, SSDMixer
from .necks import ConcatNeck
# last: it imports mmdinomamba.analysis, which reads the modules above
from .activation_map_model import ActivationMapModel

__all__ = ['ActivationMapModel', 'ConcatNeck', 'DINOHead', 'DINOLoss', 'DinoVim',
           'LinearAttention', 'LinearViT', 'SSDMixer']
