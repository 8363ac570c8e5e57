"""Self-supervised algorithms (need mmpretrain)."""
from .dino import DINO

__all__ = ['DINO']
