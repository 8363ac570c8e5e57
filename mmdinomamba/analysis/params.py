"""Parameter counts of the paper's backbones (built on the meta device, no memory)."""
from typing import List, Optional, Tuple

import torch

from mmdinomamba.models.backbones import DinoVim, LinearViT
from mmdinomamba.zoo import BACKBONES

# the classes of the paper's backbones in :data:`mmdinomamba.zoo.BACKBONES`
# (mmpretrain's VisionTransformer is imported where it is used: it needs mmpretrain;
# MLLA's counts, with its classifier, are in configs/mlla/metafile.yml)
CLASSES = {'DinoVim': DinoVim, 'LinearViT': LinearViT}


def num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def count_backbone_params() -> List[Tuple[str, int, Optional[float]]]:
    """(name, parameter count, the paper's count in M or None) for each of the
    paper's backbones in :data:`mmdinomamba.zoo.BACKBONES`; ``vit-base`` only where
    mmpretrain imports."""
    classes = dict(CLASSES)
    try:
        from mmpretrain.models import VisionTransformer
        classes['VisionTransformer'] = VisionTransformer
    except ImportError:
        pass
    rows = []
    with torch.device('meta'):
        for name, (cfg, _, paper) in BACKBONES.items():
            kwargs = dict(cfg)
            cls = classes.get(kwargs.pop('type'))
            if cls is not None:
                rows.append((name, num_params(cls(**kwargs)), paper))
    return rows
