"""Tiny models for the tests, built one way.

Each factory seeds torch's generator with ``seed`` first (None: leaves it as it
is), so that a test gets the same weights wherever it builds one; every other
argument is the model's own (the width and depth go into ``arch``; an ``arch``
given, a preset name or a dict, is passed as it is instead).
"""
from typing import Optional

import torch


def _seeded(seed: Optional[int]) -> None:
    if seed is not None:
        torch.manual_seed(seed)


def dinovim(embed_dims: int = 32, num_layers: int = 2, seed: Optional[int] = 0,
            **kwargs):
    """A :class:`~mmdinomamba.models.DinoVim` ``embed_dims`` wide and
    ``num_layers`` deep; ``kwargs`` as DinoVim's (``mixer_cfg``, ``img_size``...)."""
    from mmdinomamba.models import DinoVim
    _seeded(seed)
    arch = kwargs.pop('arch', dict(embed_dims=embed_dims, num_layers=num_layers))
    return DinoVim(arch=arch, **kwargs)


def linear_vit(embed_dims: int = 32, num_layers: int = 2, num_heads: int = 2,
               mlp_ratio: float = 2, seed: Optional[int] = 0, **kwargs):
    """A :class:`~mmdinomamba.models.LinearViT`; ``kwargs`` as LinearViT's."""
    from mmdinomamba.models import LinearViT
    _seeded(seed)
    arch = kwargs.pop('arch', dict(embed_dims=embed_dims, num_layers=num_layers,
                                   num_heads=num_heads, mlp_ratio=mlp_ratio))
    return LinearViT(arch=arch, **kwargs)


def mmpretrain_vit(embed_dims: int = 32, num_layers: int = 2, num_heads: int = 2,
                   feedforward_channels: int = 64, seed: Optional[int] = 0, **kwargs):
    """mmpretrain's ``VisionTransformer`` (softmax attention); ``kwargs`` as its."""
    from mmpretrain.models import VisionTransformer
    _seeded(seed)
    arch = kwargs.pop('arch', dict(embed_dims=embed_dims, num_layers=num_layers,
                                   num_heads=num_heads,
                                   feedforward_channels=feedforward_channels))
    return VisionTransformer(arch=arch, **kwargs)
