"""Loading a backbone's weights from a checkpoint, with every key accounted for.

One rule for every way a backbone gets weights (``init_cfg=dict(type='Pretrained',
...)`` on our backbones, :func:`mmdinomamba.analysis.load_backbone`, the
``ActivationMapModel`` of Binary-AUC):

1. The state dict is ``checkpoint['state_dict']`` (mmengine), ``['teacher']``
   (official DINO checkpoints) or ``['model']``, else the checkpoint itself.
2. The backbone's tensors are the keys under ``prefix`` (stripped); without a
   prefix, under the first of :data:`BACKBONE_PREFIXES` that holds any backbone
   key: a DINO checkpoint's teacher, then a classifier's or a student's
   ``backbone.``, DDP's ``module.``, then bare keys (what
   ``tools/model_converters/extract_teacher.py`` writes).
3. Every key is accounted for: *missing* (the backbone has it, the checkpoint
   does not), *unexpected* (under the prefix, inside the backbone's own
   namespace, e.g. ``layers.12.*`` for a 12-block model, or an unknown mixer
   tensor) and *ignored* (another part of the larger model, e.g. ``head.*``).
   Missing or unexpected keys, or a tensor of the wrong shape, fail with a
   ValueError that lists them, unless ``strict=False``: then they are logged
   as a warning and the uncovered parameters keep their initial values. Shape
   mismatches always fail. A ``pos_embed`` made for another grid is not a
   mismatch: the backbone's load hook resizes it.

torch + mmengine only.
"""
import logging
import os.path as osp
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

Tensor = torch.Tensor

BACKBONE_PREFIXES = ('teacher.backbone.', 'backbone.', 'module.backbone.', 'module.', '')
STATE_DICT_KEYS = ('state_dict', 'teacher', 'model')
# keys of dict(type='Pretrained', ...) on our backbones
PRETRAINED_KEYS = ('type', 'checkpoint', 'prefix', 'map_location', 'strict')
# shapes a load hook adapts (pos_embed of another grid)
RESIZED_ON_LOAD = ('pos_embed', )

__all__ = ['BACKBONE_PREFIXES', 'KeyReport', 'checked_backbone_state',
           'checkpoint_state_dict', 'key_report',
           'load_backbone_checkpoint', 'load_backbone_state', 'load_pretrained',
           'pretrained_cfg', 'select_backbone_state']


def _listed(keys: List[str]) -> str:
    return ', '.join(keys)


def checkpoint_state_dict(checkpoint, source: str = 'checkpoint') -> Dict[str, Tensor]:
    """The state dict inside a loaded checkpoint (rule 1 of the module docstring).

    Args:
        checkpoint (dict): the loaded file.
        source (str): name for messages (e.g. the path).

    Returns:
        dict: name -> tensor (non-tensor entries dropped).
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f'{source}: a checkpoint must be a dict, got '
                         f'{type(checkpoint).__name__}')
    state = checkpoint
    for name in STATE_DICT_KEYS:
        if isinstance(checkpoint.get(name), dict):
            state = checkpoint[name]
            break
    tensors = {k: v for k, v in state.items()
               if isinstance(k, str) and torch.is_tensor(v)}
    if not tensors:
        raise ValueError(f'{source}: no tensors found in the checkpoint (top-level '
                         f'keys: {sorted(map(str, checkpoint))[:10]})')
    return tensors


def select_backbone_state(state: Dict[str, Tensor], backbone: nn.Module,
                          prefix: Optional[str] = None,
                          source: str = 'checkpoint') -> Tuple[Dict[str, Tensor], str]:
    """The backbone's tensors of a state dict, prefix stripped (rule 2).

    Args:
        state (dict): a state dict.
        backbone (nn.Module): the model to fill.
        prefix (str, optional): key prefix of the backbone; None tries
            :data:`BACKBONE_PREFIXES` in order.
        source (str): name for messages.

    Returns:
        tuple: the tensors under the prefix (keys stripped) and the prefix.
    """
    wanted = set(backbone.state_dict())
    if prefix and not prefix.endswith('.'):
        prefix += '.'  # as mmengine's Pretrained init
    prefixes = BACKBONE_PREFIXES if prefix is None else (prefix, )
    for start in prefixes:
        picked = {k[len(start):]: v for k, v in state.items() if k.startswith(start)}
        if wanted & set(picked):
            return picked, start
    raise ValueError(
        f'{source}: the checkpoint has no {type(backbone).__name__} tensors under '
        f'any of the prefixes {list(prefixes)} (all {len(wanted)} backbone keys '
        f'missing): none of its keys (e.g. {list(state)[:5]}) matches the '
        'backbone; check the config, the checkpoint or the prefix')


class KeyReport:
    """Missing, unexpected and ignored keys of a backbone state dict (rule 3).

    Attributes:
        missing (list[str]): backbone keys the checkpoint lacks.
        unexpected (list[str]): checkpoint keys inside the backbone's namespace
            that the backbone does not have.
        ignored (list[str]): checkpoint keys of other parts of a larger model.
        mismatched (list[str]): ``'key: checkpoint shape vs backbone shape'``.
    """

    def __init__(self, missing, unexpected, ignored, mismatched):
        self.missing = missing
        self.unexpected = unexpected
        self.ignored = ignored
        self.mismatched = mismatched

    def problems(self) -> List[str]:
        out = []
        if self.missing:
            out.append(f'{len(self.missing)} missing keys (the checkpoint lacks '
                       f'{len(self.missing)} backbone tensors): {_listed(self.missing)}')
        if self.unexpected:
            out.append(f'{len(self.unexpected)} unexpected keys: '
                       f'{_listed(self.unexpected)}')
        return out


def key_report(backbone: nn.Module, state: Dict[str, Tensor]) -> KeyReport:
    """Account for every key of ``state`` against ``backbone`` (rule 3).

    Keys a backbone lists in ``optional_state_keys()`` (e.g. MLLA's output norms
    for dense heads, which a classifier checkpoint does not have) are not missing
    when absent: they keep their initial values, which is logged.
    """
    own = backbone.state_dict()
    namespace = {name.split('.')[0] for name in own}
    optional = set(getattr(backbone, 'optional_state_keys', list)())
    absent = sorted(optional & (set(own) - set(state)))
    if absent:
        print_log(f'{type(backbone).__name__}: {len(absent)} tensors not in the '
                  f'checkpoint keep their initialisation: {_listed(absent)}',
                  logger='current')
    missing = sorted(set(own) - set(state) - optional)
    extra = sorted(set(state) - set(own))
    unexpected = [k for k in extra if k.split('.')[0] in namespace]
    ignored = [k for k in extra if k.split('.')[0] not in namespace]
    mismatched = [f'{k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)}'
                  for k in sorted(set(state) & set(own))
                  if k not in RESIZED_ON_LOAD and state[k].shape != own[k].shape]
    return KeyReport(missing, unexpected, ignored, mismatched)


def checked_backbone_state(backbone: nn.Module, state: Dict[str, Tensor],
                           prefix: Optional[str] = None, strict: bool = True,
                           source: str = 'checkpoint'
                           ) -> Tuple[Dict[str, Tensor], str]:
    """The backbone's tensors of ``state``, every key checked (rules 2 and 3).

    Args:
        backbone (nn.Module): the model to fill.
        state (dict): a state dict (the whole model's, or the backbone's).
        prefix (str, optional): key prefix of the backbone; None to pick it.
        strict (bool): fail on missing or unexpected keys (True) or only warn.
            Defaults to True.
        source (str): name for messages (e.g. the path).

    Returns:
        tuple: the tensors to load (backbone names, only the backbone's own
        keys) and the prefix used.
    """
    picked, prefix = select_backbone_state(state, backbone, prefix, source)
    report = key_report(backbone, picked)
    name = type(backbone).__name__
    where = f'{source} (prefix {prefix!r})'
    if report.mismatched:
        raise ValueError(f'{where} does not fit {name}: {len(report.mismatched)} '
                         f'tensors of the wrong shape: {_listed(report.mismatched)}')
    problems = report.problems()
    if problems and strict:
        raise ValueError(f'{where} does not cover {name}: ' + '; '.join(problems) +
                         ". Pass strict=False (init_cfg=dict(type='Pretrained', "
                         '..., strict=False)) to load it anyway.')
    for problem in problems:
        print_log(f'{where}, loaded with strict=False: {problem}', logger='current',
                  level=logging.WARNING)
    extra = set(report.unexpected) | set(report.ignored)
    used = {k: v for k, v in picked.items() if k not in extra}
    unused = len(state) - len(used)
    print_log(f'{name}: {len(used)} tensors from {where}' +
              (f'; {unused} other tensors of the checkpoint not used' if unused else ''),
              logger='current')
    return used, prefix


def load_backbone_state(backbone: nn.Module, state: Dict[str, Tensor],
                        prefix: Optional[str] = None, strict: bool = True,
                        source: str = 'checkpoint') -> str:
    """Load the backbone's tensors of a state dict into ``backbone``.

    Arguments as :func:`checked_backbone_state`.

    Returns:
        str: the prefix used.
    """
    used, prefix = checked_backbone_state(backbone, state, prefix, strict, source)
    backbone.load_state_dict(used, strict=False)
    return prefix


def _load_file(path: str, map_location='cpu'):
    if '://' not in path and not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint {path!r} does not exist')
    from mmengine.runner import CheckpointLoader
    return CheckpointLoader.load_checkpoint(path, map_location=map_location)


def load_backbone_checkpoint(backbone: nn.Module, path: str,
                             prefix: Optional[str] = None, strict: bool = True,
                             map_location='cpu') -> str:
    """Load a checkpoint file (any mmengine ``CheckpointLoader`` scheme) into
    ``backbone`` by the rules of the module docstring.

    Args:
        backbone (nn.Module): the model to fill.
        path (str): checkpoint file or URL.
        prefix (str, optional): key prefix of the backbone; None to pick it.
        strict (bool): fail on missing or unexpected keys. Defaults to True.
        map_location: where tensors are loaded. Defaults to 'cpu'.

    Returns:
        str: the prefix used.
    """
    state = checkpoint_state_dict(_load_file(path, map_location), path)
    return load_backbone_state(backbone, state, prefix, strict, path)


def pretrained_cfg(init_cfg) -> Optional[dict]:
    """The ``dict(type='Pretrained', ...)`` entry of an ``init_cfg``, or None."""
    cfgs = init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]
    found = [c for c in cfgs if isinstance(c, dict) and c.get('type') == 'Pretrained']
    if len(found) > 1:
        raise ValueError(f'init_cfg has {len(found)} Pretrained entries; give one')
    return found[0] if found else None


def load_pretrained(backbone: nn.Module, cfg: dict) -> str:
    """Apply ``dict(type='Pretrained', checkpoint, prefix=None, map_location='cpu',
    strict=True)`` to ``backbone``.

    Returns:
        str: the prefix used.
    """
    unknown = sorted(set(cfg) - set(PRETRAINED_KEYS))
    if unknown:
        raise ValueError(f'init_cfg Pretrained: unknown keys {unknown}; allowed: '
                         f'{list(PRETRAINED_KEYS)}')
    if not cfg.get('checkpoint'):
        raise ValueError('init_cfg Pretrained needs a `checkpoint`')
    strict = cfg.get('strict', True)
    if not isinstance(strict, bool):
        raise ValueError(f'init_cfg Pretrained: strict must be True or False, got '
                         f'{strict!r}')
    return load_backbone_checkpoint(backbone, cfg['checkpoint'], cfg.get('prefix'),
                                    strict, cfg.get('map_location', 'cpu'))
