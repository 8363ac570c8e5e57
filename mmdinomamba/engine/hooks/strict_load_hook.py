"""Refuse a checkpoint that does not fit or fill the model, or whose tensors are not
finite."""
import re
from typing import Dict, List

import torch
from mmengine.hooks import Hook

from mmdinomamba.models.checkpoint import shape_mismatches
from mmdinomamba.utils.safe_load import CONVERTER
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
    """Refuse a loaded checkpoint that does not fit the model, leaves model
    tensors uninitialised or holds NaN or infinite values.

    mmengine loads ``load_from``, ``--resume`` and the checkpoint of
    ``tools/test.py`` with ``strict=False``: tensors the checkpoint lacks keep
    their initial values, tensors of another shape are skipped with a log line,
    and the run goes on, so a random head evaluates as if trained. This hook
    checks the checkpoint when it is loaded, before it reaches the model (after
    mmengine's key revision, which drops a leading ``module.``):

    - every floating-point tensor in it must be finite;
    - every tensor the checkpoint shares with the model must have the model's
      shape (a ``pos_embed`` of another grid with the model's channels excepted:
      the backbones' load hooks resize it), with ``strict=False`` too;
    - every tensor of the model's ``state_dict`` must be in it.

    Otherwise ValueError, and nothing is loaded: the message gives the counts
    and names the tensors, shape mismatches first, then the missing ones, and,
    for an official Dino-Mamba file or a DINO pretraining checkpoint, what to do
    with it instead. With ``strict=False`` missing tensors are only logged,
    unless ``evaluation`` is set and the checkpoint holds none of the
    backbone's tensors (``backbone.*``; the whole model's when it has no
    backbone): scores of a random backbone are refused.

    Checkpoint tensors the model does not have are left to mmengine (logged).
    ``tools/train.py``, ``tools/test.py`` and ``tools/analysis/robustness.py``
    register it; their ``--no-strict`` sets ``strict=False``.

    Args:
        strict (bool): refuse (True) or only warn about (False) model tensors the
            checkpoint lacks; non-finite and misshapen tensors are refused
            either way. Defaults to True.
        evaluation (bool): the run scores the model (``tools/test.py``): a
            checkpoint that fills none of the backbone is refused, with
            ``strict=False`` too. Defaults to False.
    """
    priority = 'VERY_HIGH'

    def __init__(self, strict: bool = True, evaluation: bool = False):
        for name, value in (('strict', strict), ('evaluation', evaluation)):
            if not isinstance(value, bool):
                raise TypeError(f'StrictLoadHook: {name} must be True or False, got '
                                f'{value!r}')
        self.strict = strict
        self.evaluation = evaluation

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
        mismatched = shape_mismatches(own, tensors)
        missing = [k for k in own if k not in tensors]
        hint = _hint(source, list(tensors))
        absent = (f'{len(missing)} of the model\'s {len(own)} tensors uninitialised '
                  f'(not in the checkpoint): {_listed(missing)}')
        if mismatched:
            raise ValueError(
                f'{source} does not fit the model: {len(mismatched)} of the model\'s '
                f'{len(own)} tensors have another shape in it (checkpoint vs '
                f'model): {_listed(mismatched)}' + (f'; and it would leave {absent}'
                                                    if missing else '') +
                f'.{hint} Nothing was loaded. A checkpoint of another architecture or '
                'width does not fit, with --no-strict neither: take the '
                "checkpoint made for this config.")
        if not missing:
            return
        text = f'{source} leaves {absent}.{hint}'
        if self.strict:
            raise ValueError(text + ' To load it anyway (the missing tensors keep their '
                             'initial values), pass --no-strict.')
        backbone = [k for k in own if k.startswith('backbone.')] or list(own)
        if self.evaluation and all(k not in tensors for k in backbone):
            raise ValueError(
                f'{source} holds none of the {len(backbone)} tensors of the model\'s '
                'backbone: refusing to score a randomly initialised backbone, '
                f'--no-strict or not.{hint}')
        runner.logger.warning(text + ' Loaded anyway (--no-strict): the missing '
                              'tensors keep their initial values.')
