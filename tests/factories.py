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


# Tiny MLLA archs (data). MLLA_SMALL is the arch of the official fixture
# tests/data/official_mlla_small.pt (tests/data/make_official_mlla.py): tests that
# compare with it must use it as it is.
MLLA_SMALL = dict(embed_dims=12, depths=[1, 1, 2, 1], num_heads=[3, 3, 6, 12],
                  mlp_ratio=4.0)
MLLA_TINY = dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8],
                 mlp_ratio=2.0)
PLAIN_MLLA_TINY = dict(embed_dims=16, num_layers=3, num_heads=2, mlp_ratio=2.0)


def mlla_arch(base: Optional[dict] = None, **changes) -> dict:
    """A fresh copy of the arch dict ``base`` (default :data:`MLLA_TINY`) with
    ``changes`` (e.g. ``depths=[2, 1, 1, 1]``); also for a PlainMLLA arch."""
    arch = {k: list(v) if isinstance(v, list) else v
            for k, v in (MLLA_TINY if base is None else base).items()}
    unknown = sorted(set(changes) - set(arch))
    if unknown:
        raise KeyError(f'mlla_arch: {unknown} are not keys of the arch {sorted(arch)}')
    arch.update(changes)
    return arch


def mlla(seed: Optional[int] = 0, **kwargs):
    """An :class:`~mmdinomamba.models.MLLA` of :data:`MLLA_TINY` (or ``arch``);
    ``kwargs`` as MLLA's."""
    from mmdinomamba.models import MLLA
    _seeded(seed)
    return MLLA(arch=kwargs.pop('arch', mlla_arch()), **kwargs)


def plain_mlla(seed: Optional[int] = 0, **kwargs):
    """A :class:`~mmdinomamba.models.PlainMLLA` of :data:`PLAIN_MLLA_TINY` (or
    ``arch``); ``kwargs`` as PlainMLLA's."""
    from mmdinomamba.models import PlainMLLA
    _seeded(seed)
    return PlainMLLA(arch=kwargs.pop('arch', mlla_arch(PLAIN_MLLA_TINY)), **kwargs)
