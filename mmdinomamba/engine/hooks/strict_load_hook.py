"""Refuse a checkpoint that does not fill the model, or whose tensors are not finite."""
import re
from typing import Dict, List

import torch
from mmengine.hooks import Hook

from ..checkpoint import CONVERTER
from ..finite import non_finite
from .utils import unwrap_model

# mmengine's default key revision when it loads a checkpoint into the model
MODULE_PREFIX = re.compile(r'^module\.')
# a tensor only the official Dino-Mamba layout has at the top level (our models
# hold it under `backbone.`)
OFFICIAL_KEY = re.compile(r'^(module\.)?layers\.\d+\.mixer\.(A_log_b|dt_b_bias)$')
LISTED = 8


def _listed(names: List[str]) -> str:
    more = f' and {len(names) - LISTED} more' if len(names) > LISTED else ''
    return ', '.join(names[:LISTED]) + more


def _hint(source: str, keys: List[str]) -> str:
    """What the checkpoint is, when its keys tell, and what to do with it."""
    official = next((k for k in keys if OFFICIAL_KEY.match(k)), None)
    if official:
        return (f' Its keys have the official Dino-Mamba layout ({official}): convert '
                f'it first,\n    python {CONVERTER} {source} OUT.pth\nthen load OUT.pth '
                "as the backbone's init_cfg=dict(type='Pretrained', checkpoint=...).")
    if any(k.startswith('teacher.backbone.') for k in keys):
        return (' It is a DINO pretraining checkpoint (teacher.backbone.* keys): a '
                "linear-probe or dense config loads its teacher through the backbone's "
                'init_cfg; train that config and load its checkpoint.')
    return ''


class StrictLoadHook(Hook):
    """Refuse a loaded checkpoint that leaves model tensors uninitialised or holds
    NaN or infinite values.

    mmengine loads ``load_from`` (and the checkpoint of ``tools/test.py``) with
    ``strict=False``: tensors the checkpoint lacks keep their initial values and
    the run goes on, so a random head evaluates as if trained. This hook checks
    the checkpoint when it is loaded, before it reaches the model:

    - every tensor of the model's ``state_dict`` must be in it (after mmengine's
      key revision, which drops a leading ``module.``); otherwise ValueError naming
      the missing tensors, and, for an official Dino-Mamba file or a DINO
      pretraining checkpoint, what to do with it instead;
    - every floating-point tensor in it must be finite; otherwise ValueError
      naming them.

    Checkpoint tensors the model does not have are left to mmengine (logged).
    ``tools/train.py`` and ``tools/test.py`` register it; their ``--no-strict``
    sets ``strict=False``.

    Args:
        strict (bool): refuse (True) or only warn about (False) model tensors the
            checkpoint lacks; non-finite tensors are refused either way. Defaults
            to True.
    """
    priority = 'VERY_HIGH'

    def __init__(self, strict: bool = True):
        if not isinstance(strict, bool):
            raise TypeError(f'StrictLoadHook: strict must be True or False, got '
                            f'{strict!r}')
        self.strict = strict

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        source = getattr(runner, '_load_from', None) or 'the checkpoint'
        state = checkpoint.get('state_dict', checkpoint)
        tensors: Dict[str, torch.Tensor] = {
            MODULE_PREFIX.sub('', k): v for k, v in state.items()
            if isinstance(k, str) and torch.is_tensor(v)}
        bad = non_finite(tensors.items())
        if bad:
            raise ValueError(f'{source}: {len(bad)} tensors hold NaN or infinite '
                             f'values: {_listed(bad)}. Refusing to load it (a '
                             'diverged run? take an earlier checkpoint)')
        own = unwrap_model(runner.model).state_dict()
        missing = [k for k in own if k not in tensors]
        if not missing:
            return
        text = (f'{source} leaves {len(missing)} of the model\'s {len(own)} tensors '
                f'uninitialised (not in the checkpoint): {_listed(missing)}.'
                f'{_hint(source, list(tensors))}')
        if self.strict:
            raise ValueError(text + ' To load it anyway (the missing tensors keep their '
                             'initial values), pass --no-strict.')
        runner.logger.warning(text + ' Loaded anyway (--no-strict): the missing '
                              'tensors keep their initial values.')
