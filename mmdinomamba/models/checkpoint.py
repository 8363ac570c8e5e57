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
   Missing or unexpected keys fail with a ValueError that lists them, unless
   ``strict=False``: then they are logged as a warning and the uncovered
   parameters keep their initial values. A tensor of the wrong shape always
   fails, ``strict=False`` too, and nothing is loaded: the message lists the
   shape mismatches first, then the missing and unexpected keys, each with its
   count. A ``pos_embed`` made for another grid (same channels) is not a
   mismatch: the backbone's load hook resizes it.
4. The tensors loaded must be finite: a NaN or an infinity fails, naming the
   file and the tensors.

Other modules (mmpretrain's ViT, mmdet's and mmseg's backbones) get mmengine's
``Pretrained`` initialiser, which ``import mmdinomamba`` replaces by
:class:`CheckedPretrainedInit`: rules 3 and 4 for the shapes and finiteness, keys
strict with ``strict=True`` (logged otherwise, as mmengine does).

torch, mmengine and the package's leaf, :mod:`mmdinomamba.utils`, only.
"""
import logging
import os.path as osp
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from mmdinomamba.utils import load_checkpoint_file, save_atomic

Tensor = torch.Tensor

BACKBONE_PREFIXES = ('teacher.backbone.', 'backbone.', 'module.backbone.', 'module.', '')
STATE_DICT_KEYS = ('state_dict', 'teacher', 'model')
# keys of dict(type='Pretrained', ...) on our backbones
PRETRAINED_KEYS = ('type', 'checkpoint', 'prefix', 'map_location', 'strict')
# shapes a load hook adapts (pos_embed of another grid)
RESIZED_ON_LOAD = ('pos_embed', )
# the backbones of a DINO checkpoint (mmdinomamba.models.selfsup.DINO), by branch
DINO_BRANCHES = {'teacher': 'teacher.backbone.', 'student': 'backbone.'}

__all__ = ['BACKBONE_PREFIXES', 'DINO_BRANCHES', 'CheckedPretrainedInit', 'KeyReport',
           'check_finite', 'checked_backbone_state', 'checkpoint_state_dict', 'dino_backbone_state',
           'extract_dino_backbone', 'key_report', 'load_backbone_checkpoint',
           'load_backbone_state', 'load_model_state', 'load_pretrained', 'read_state_dict',
           'non_finite_tensors', 'pretrained_cfg', 'register_checked_pretrained',
           'resized_on_load', 'select_backbone_state', 'shape_mismatches']


def _listed(keys: List[str]) -> str:
    return ', '.join(keys)


def resized_on_load(name: str, saved: torch.Size, own: torch.Size) -> bool:
    """Whether a load hook adapts a checkpoint tensor of shape ``saved`` to
    ``own``: a position table (:data:`RESIZED_ON_LOAD`) made for another grid,
    with the same number of dimensions and channels (the last dimension)."""
    return name.rsplit('.', 1)[-1] in RESIZED_ON_LOAD and len(saved) == len(own) \
        and len(own) > 0 and saved[-1] == own[-1]


def shape_mismatches(own: Dict[str, Tensor], state: Dict[str, Tensor]) -> List[str]:
    """``'name: checkpoint shape vs model shape'`` of every tensor both hold with
    different shapes (a position table of another grid excepted), in the model's
    order."""
    return [f'{k}: {tuple(state[k].shape)} vs {tuple(v.shape)}'
            for k, v in own.items()
            if k in state and torch.is_tensor(state[k]) and state[k].shape != v.shape
            and not resized_on_load(k, state[k].shape, v.shape)]


def non_finite_tensors(state: Dict[str, Tensor]) -> List[str]:
    """The names of the floating-point tensors of ``state`` that hold a NaN or an
    infinity, in order (one check a tensor, at load time)."""
    return [k for k, v in state.items()
            if torch.is_tensor(v) and (v.is_floating_point() or v.is_complex())
            and not bool(torch.isfinite(v).all())]


def check_finite(state: Dict[str, Tensor], source: str) -> None:
    """Raise ValueError naming ``source`` and every tensor of ``state`` that holds
    a NaN or an infinity."""
    bad = non_finite_tensors(state)
    if bad:
        raise ValueError(f'{source}: {len(bad)} tensors hold NaN or infinite values: '
                         f'{_listed(bad)}. Refusing to load them (a diverged run? '
                         'take an earlier checkpoint)')


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
    return KeyReport(missing, unexpected, ignored, shape_mismatches(own, state))


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
    problems = report.problems()
    if report.mismatched:
        raise ValueError(
            f'{where} does not fit {name}: {len(report.mismatched)} of its '
            f'{len(backbone.state_dict())} tensors have the wrong shape (checkpoint '
            f'vs model): {_listed(report.mismatched)}' +
            ''.join(f'; {problem}' for problem in problems) +
            '. Nothing was loaded: a checkpoint of another architecture or width '
            'does not fit, with strict=False neither; take the checkpoint made '
            'for this config')
    extra = set(report.unexpected) | set(report.ignored)
    check_finite({k: v for k, v in picked.items() if k not in extra}, source)
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
    return load_backbone_state(backbone, read_state_dict(path, map_location), prefix,
                               strict, path)


def pretrained_cfg(init_cfg) -> Optional[dict]:
    """The ``dict(type='Pretrained', ...)`` entry of an ``init_cfg``, or None."""
    cfgs = init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]
    found = [c for c in cfgs if isinstance(c, dict) and c.get('type') == 'Pretrained']
    if len(found) > 1:
        raise ValueError(f'init_cfg has {len(found)} Pretrained entries; give one')
    return found[0] if found else None


def read_state_dict(path: str, map_location='cpu') -> Dict[str, Tensor]:
    """The state dict of a checkpoint file (any mmengine ``CheckpointLoader``
    scheme), found by rule 1 of the module docstring."""
    return checkpoint_state_dict(_load_file(path, map_location), path)


def load_pretrained(backbone: nn.Module, cfg: dict,
                    read_state: Callable[..., Dict[str, Tensor]] = read_state_dict) -> str:
    """Apply ``dict(type='Pretrained', checkpoint, prefix=None, map_location='cpu',
    strict=True)`` to ``backbone``.

    Args:
        backbone (nn.Module): the model to fill.
        cfg (dict): the ``Pretrained`` entry of its ``init_cfg``.
        read_state (callable): ``read_state(path, map_location)`` -> the file's
            state dict (a backbone that converts foreign layouts passes its own).
            Defaults to :func:`read_state_dict`.

    Returns:
        str: the prefix used.
    """
    name = type(backbone).__name__
    unknown = sorted(set(cfg) - set(PRETRAINED_KEYS))
    if unknown:
        raise ValueError(f'{name} init_cfg Pretrained: unknown keys {unknown}; '
                         f'allowed: {list(PRETRAINED_KEYS)}')
    path = cfg.get('checkpoint')
    if not path:
        raise ValueError(f'{name} init_cfg Pretrained needs a `checkpoint`')
    strict = cfg.get('strict', True)
    if not isinstance(strict, bool):
        raise ValueError(f'{name} init_cfg Pretrained: strict must be True or False, '
                         f'got {strict!r}')
    state = read_state(path, cfg.get('map_location', 'cpu'))
    return load_backbone_state(backbone, state, cfg.get('prefix'), strict, path)


def dino_backbone_state(state_dict: Dict[str, Tensor],
                        branch: str = 'teacher') -> 'OrderedDict[str, Tensor]':
    """One backbone of a DINO model's state dict, its prefix stripped.

    A checkpoint of ``tools/train.py configs/dino/...`` holds the whole
    :class:`~mmdinomamba.models.selfsup.DINO`: the student (``backbone.*``,
    ``head.*``), the EMA teacher (``teacher.backbone.*``, ``teacher.head.*``) and
    the loss centre. The teacher backbone is the one evaluated (as in the paper).

    Args:
        state_dict (dict): the ``state_dict`` of a DINO checkpoint.
        branch (str): 'teacher' or 'student'. Defaults to 'teacher'.

    Returns:
        OrderedDict: the branch's backbone tensors, in the file's order.

    Raises:
        ValueError: an unknown branch, or no tensor of that branch.
    """
    if branch not in DINO_BRANCHES:
        raise ValueError(f'branch must be one of {sorted(DINO_BRANCHES)}, got '
                         f'{branch!r}')
    prefix = DINO_BRANCHES[branch]
    out = OrderedDict((key[len(prefix):], value) for key, value in state_dict.items()
                      if key.startswith(prefix))
    if not out:
        raise ValueError(f'no `{prefix}*` tensors in the state dict: not a DINO '
                         f'checkpoint? (first keys: {list(state_dict)[:5]})')
    return out


def extract_dino_backbone(src: str, dst: str, branch: str = 'teacher') -> int:
    """Write the ``branch`` backbone of the DINO checkpoint ``src`` to ``dst``.

    ``dst`` holds ``state_dict`` (bare backbone keys, what
    ``init_cfg=dict(type='Pretrained', checkpoint=dst)`` reads) and ``meta``
    (``source``, ``branch``, and the ``epoch`` and ``iter`` of ``src``); it is
    written atomically.

    Returns:
        int: the number of tensors written.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: ``src`` is empty, not a checkpoint, not a DINO one, or its
            backbone holds NaN or infinite values (nothing is written).
        UnsafeCheckpointError: ``src`` holds objects that are not data.
    """
    checkpoint = load_checkpoint_file(src, map_location='cpu')
    if not isinstance(checkpoint, dict):
        raise ValueError(f'{src}: a checkpoint must be a dict, got '
                         f'{type(checkpoint).__name__}')
    try:
        state = dino_backbone_state(checkpoint.get('state_dict', checkpoint), branch)
    except ValueError as err:
        raise ValueError(f'{src}: {err}') from None
    check_finite(state, f'{src} ({branch} backbone)')
    meta = dict(source=osp.abspath(src), branch=branch)
    for key in ('epoch', 'iter'):
        if key in checkpoint.get('meta', {}):
            meta[key] = checkpoint['meta'][key]
    save_atomic(dict(state_dict=state, meta=meta), dst)
    return len(state)


def load_model_state(model: nn.Module, state: Dict[str, Tensor], strict: bool = True,
                     source: str = 'checkpoint') -> None:
    """Load a whole model's state dict, every tensor checked.

    The tensors must be finite and have the model's shapes (a ``pos_embed`` of
    another grid excepted), with ``strict=False`` too: otherwise ValueError
    naming ``source`` and the tensors, shape mismatches first, and nothing is
    loaded. With ``strict`` the keys must match as well (missing and unexpected
    listed with counts); without, they are logged.

    Args:
        model (nn.Module): the module to fill.
        state (dict): its state dict (a leading ``module.`` is dropped).
        strict (bool): fail on missing or unexpected keys. Defaults to True.
        source (str): name for messages (the file).
    """
    state = {k[len('module.'):] if k.startswith('module.') else k: v
             for k, v in state.items()}
    check_finite(state, source)
    own = model.state_dict()
    mismatched = shape_mismatches(own, state)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    keys = ([f'{len(missing)} of the model\'s {len(own)} tensors missing: '
             f'{_listed(missing)}'] if missing else []) + \
        ([f'{len(unexpected)} unexpected tensors: {_listed(unexpected)}']
         if unexpected else [])
    name = type(model).__name__
    if mismatched:
        raise ValueError(
            f'{source} does not fit {name}: {len(mismatched)} of its {len(own)} '
            f'tensors have the wrong shape (checkpoint vs model): '
            f'{_listed(mismatched)}' + ''.join(f'; {k}' for k in keys) +
            '. Nothing was loaded: a checkpoint of another architecture or width '
            'does not fit, with strict=False neither')
    if keys and strict:
        raise ValueError(f'{source} does not cover {name}: ' + '; '.join(keys) +
                         ". Pass strict=False (init_cfg=dict(type='Pretrained', "
                         '..., strict=False)) to load it anyway.')
    for problem in keys:
        print_log(f'{source}, loaded into {name} with strict=False: {problem}',
                  logger='current', level=logging.WARNING)
    model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)


class CheckedPretrainedInit:
    """mmengine's ``init_cfg=dict(type='Pretrained', checkpoint, prefix=None,
    map_location='cpu')`` for modules that are not ours (mmpretrain's
    ``VisionTransformer``, mmdet's and mmseg's backbones), with the checks
    mmengine leaves out, and one more key, ``strict``.

    mmengine's ``PretrainedInit`` loads with ``strict=False`` and logs what does
    not fit: tensors of another shape are skipped and missing ones keep their
    random values, so a wrong checkpoint initialises 2 of 54 tensors and the run
    goes on. This one selects the tensors as mmengine does (``state_dict`` or
    the file itself; the keys under ``prefix``, stripped; without a prefix, every
    key, a leading ``module.`` dropped) and loads them with
    :func:`load_model_state`: a NaN or an infinity, or a tensor of another
    shape, always fails and loads nothing; missing or unexpected keys fail with
    ``strict=True`` and are logged (mmengine's behaviour) with the default
    ``strict=False``. Our backbones load their own ``Pretrained`` init_cfg
    (:func:`load_pretrained`, strict by default) and never reach it.

    ``import mmdinomamba`` registers it as ``'Pretrained'``
    (:func:`register_checked_pretrained`).
    """

    def __init__(self, checkpoint: str, prefix: Optional[str] = None,
                 map_location='cpu', strict: bool = False):
        if not isinstance(strict, bool):
            raise ValueError(f'init_cfg Pretrained: strict must be True or False, got '
                             f'{strict!r}')
        self.checkpoint = checkpoint
        self.prefix = prefix
        self.map_location = map_location
        self.strict = strict

    def __call__(self, module: nn.Module) -> None:
        from mmengine.model.weight_init import update_init_info
        state = _load_file(self.checkpoint, self.map_location)
        if isinstance(state, dict) and isinstance(state.get('state_dict'), dict):
            state = state['state_dict']
        if not isinstance(state, dict):
            raise ValueError(f'{self.checkpoint}: a checkpoint must be a dict, got '
                             f'{type(state).__name__}')
        source = self.checkpoint
        if self.prefix is not None:
            prefix = self.prefix if self.prefix.endswith('.') else self.prefix + '.'
            state = {k[len(prefix):]: v for k, v in state.items()
                     if isinstance(k, str) and k.startswith(prefix)}
            if not state:
                raise ValueError(f'{self.checkpoint}: no tensors under the prefix '
                                 f'{prefix!r}; check init_cfg.prefix')
            source = f'{self.checkpoint} (prefix {prefix!r})'
        print_log(f'load {type(module).__name__} from {source}', logger='current')
        load_model_state(module, {k: v for k, v in state.items()
                                  if isinstance(k, str) and torch.is_tensor(v)},
                         self.strict, source)
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())

    def _get_init_info(self) -> str:
        return f'{type(self).__name__}: load from {self.checkpoint}'


def register_checked_pretrained() -> None:
    """Make :class:`CheckedPretrainedInit` mmengine's ``'Pretrained'``
    initialiser (every scope's registry falls back to mmengine's). Run by
    ``import mmdinomamba``; idempotent."""
    from mmengine.registry import WEIGHT_INITIALIZERS
    if WEIGHT_INITIALIZERS.module_dict.get('Pretrained') is not CheckedPretrainedInit:
        WEIGHT_INITIALIZERS.register_module('Pretrained', module=CheckedPretrainedInit,
                                            force=True)
