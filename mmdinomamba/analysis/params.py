"""Parameter counts of the paper's backbones (built on the meta device, no memory)."""
from typing import List, Optional, Tuple

import torch

from mmdinomamba.models.backbones import DinoVim, LinearViT

# name -> (constructor, kwargs, parameter count reported by the paper in millions)
PAPER_BACKBONES = {
    'DinoVim-T': (DinoVim, dict(arch='tiny'), None),
    'DinoVim-S': (DinoVim, dict(arch='small'), None),
    'DinoVim-B': (DinoVim, dict(arch='base'), 88.0),
    'DinoMamba-Reg-B': (DinoVim, dict(arch='base', num_registers=12), 88.0),
    'LinearViT-B': (LinearViT, dict(arch='base'), 85.0),
}


def num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def count_backbone_params() -> List[Tuple[str, int, Optional[float]]]:
    """(name, parameter count, paper's count in M or None) for each backbone."""
    rows = []
    with torch.device('meta'):
        for name, (cls, kwargs, paper) in PAPER_BACKBONES.items():
            rows.append((name, num_params(cls(**kwargs)), paper))
        try:
            from mmpretrain.models import VisionTransformer
        except ImportError:
            return rows
        rows.append(('ViT-B (mmpretrain)', num_params(VisionTransformer(arch='b')),
                     85.0))
    return rows
