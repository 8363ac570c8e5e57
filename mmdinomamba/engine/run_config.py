"""Edits of a training config by name, never by a list entry's position.

- :func:`set_run_length`: the run's epochs, its warm-up, and the one validation
  and checkpoint at its end;
- :func:`set_data_root`: every dataset of the config (the training, validation
  and test loaders, and those a hook holds) on one data root;
- :func:`set_num_workers`: the data workers of every one of those loaders;
- :func:`amp_twin` / :data:`AMP_WRAPPERS`: an optimizer wrapper and its
  mixed-precision twin;
- :func:`parse_cfg_options`: ``KEY=VALUE`` strings as ``--cfg-options`` reads them.

A scheduler of an epoch-based run that has no ``end`` ends with the run: mmengine
sets its ``end`` to ``train_cfg.max_epochs`` when it builds it, and a cosine
without ``T_max`` spans ``end - begin``. The toy schedule fragments rely on this,
so ``train_cfg.max_epochs`` alone sets their length.
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence

from mmengine.config import Config, ConfigDict, DictAction

__all__ = ['AMP_WRAPPERS', 'amp_twin', 'parse_cfg_options',
           'set_data_root', 'set_num_workers', 'set_run_length']

# each optimizer wrapper and its mixed-precision twin
AMP_WRAPPERS = {'OptimWrapper': 'AmpOptimWrapper',
                'PerParamClipOptimWrapper': 'PerParamClipAmpOptimWrapper'}


def amp_twin(wrapper: str, amp: bool) -> str:
    """The wrapper type that computes in mixed precision (``amp=True``) or in
    float32 (``amp=False``) and otherwise does what ``wrapper`` does; a type
    without a twin is returned as it is."""
    if amp:
        return AMP_WRAPPERS.get(wrapper, wrapper)
    return {v: k for k, v in AMP_WRAPPERS.items()}.get(wrapper, wrapper)


def parse_cfg_options(options: Sequence[str]) -> Dict[str, object]:
    """``['a.b=1', 'c=[1,2]']`` -> ``{'a.b': 1, 'c': [1, 2]}``, values parsed as
    ``tools/train.py --cfg-options`` parses them.

    Raises:
        ValueError: an option without ``=``.
    """
    parsed = {}
    for option in options:
        key, sep, value = option.partition('=')
        if not sep or not key:
            raise ValueError(f'a config option must be KEY=VALUE, got {option!r}')
        parsed[key] = DictAction._parse_iterable(value)
    return parsed


def _schedulers(cfg: Config) -> List[ConfigDict]:
    schedulers = cfg.get('param_scheduler') or []
    return [schedulers] if isinstance(schedulers, dict) else list(schedulers)


def set_run_length(cfg: Config, max_epochs: int,
                   warmup_epochs: Optional[int] = None) -> Config:
    """Set an epoch-based run's length in ``cfg`` (in place), by name.

    - ``train_cfg.max_epochs`` becomes ``max_epochs``; every epoch-based
      scheduler that ended with the run (no ``end``, or ``end`` at the old
      length) ends with the new one, and a ``T_max`` that spanned its
      scheduler's epochs spans the new ones;
    - the warm-up, a scheduler from epoch 0 that ends before the run does,
      lasts ``warmup_epochs`` (None: as configured) and the schedulers that
      began where it ended begin there; ``warmup_epochs=0`` removes it;
    - ``train_cfg.val_interval`` and ``default_hooks.checkpoint.interval`` that
      equalled the old length (one validation, one checkpoint, at the end)
      equal the new one.

    Args:
        cfg (Config): an epoch-based training config.
        max_epochs (int): the run's epochs, >= 1.
        warmup_epochs (int, optional): the warm-up's epochs, 0 <= warmup <
            max_epochs. Defaults to None.

    Returns:
        Config: ``cfg``.

    Raises:
        ValueError: a length out of range, a config that is not epoch-based, a
            warm-up asked of a schedule without one, or a scheduler that would
            not fit in the new run.
    """
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) \
            or max_epochs < 1:
        raise ValueError(f'max_epochs must be an int >= 1, got {max_epochs!r}')
    old = cfg.get('train_cfg', {}).get('max_epochs')
    if old is None:
        raise ValueError('set_run_length needs an epoch-based config '
                         '(train_cfg.max_epochs)')
    schedulers = _schedulers(cfg)
    for s in schedulers:
        if not s.get('by_epoch', True):
            raise ValueError(f'{s.type} counts iterations (by_epoch=False): give '
                             'its begin and end in epochs to scale it with the run')
    warmups = [s for s in schedulers if s.get('begin', 0) == 0
               and s.get('end', old) < old]
    warmup_end = max((s.end for s in warmups), default=0)
    if warmup_epochs is None:
        warmup_epochs = warmup_end
    elif warmup_epochs and not warmups:
        raise ValueError(f'warmup_epochs={warmup_epochs}: the schedule has no warm-up '
                         '(a scheduler from epoch 0 that ends before the run)')
    if not 0 <= warmup_epochs < max_epochs:
        raise ValueError(f'the warm-up ({warmup_epochs} epochs) must be shorter than '
                         f'the run ({max_epochs} epochs)')
    kept = []
    for s in schedulers:
        if any(s is w for w in warmups):
            if warmup_epochs == 0:
                continue
            s.end = warmup_epochs
        else:
            spanned = s.get('end', old) - s.get('begin', 0)
            if warmups and s.get('begin', 0) == warmup_end:
                s.begin = warmup_epochs
            if s.get('end', old) == old and 'end' in s:
                s.end = max_epochs
            if s.get('T_max') == spanned:
                s.T_max = s.get('end', max_epochs) - s.get('begin', 0)
            if s.get('end', max_epochs) <= s.get('begin', 0):
                raise ValueError(f'{s.type} (epochs {s.get("begin", 0)} to '
                                 f'{s.get("end", max_epochs)}) does not fit a run of '
                                 f'{max_epochs} epochs')
        kept.append(s)
    if schedulers:
        cfg.param_scheduler = kept
    cfg.train_cfg.max_epochs = max_epochs
    if cfg.train_cfg.get('val_interval') == old:
        cfg.train_cfg.val_interval = max_epochs
    checkpoint = cfg.get('default_hooks', {}).get('checkpoint')
    if checkpoint is not None and checkpoint.get('interval') == old:
        checkpoint.interval = max_epochs
    return cfg


def _dicts(cfg: Config, key: str) -> List[dict]:
    """Every dict of ``cfg`` with ``key``, at any depth."""
    found = []

    def visit(node):
        if isinstance(node, dict):
            if key in node:
                found.append(node)
            for value in node.values():
                visit(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                visit(value)

    for name in cfg.keys():
        visit(cfg[name])
    return found


def set_num_workers(cfg: Config, num_workers: int) -> Config:
    """Give every data loader of ``cfg`` (in place) ``num_workers`` workers, with
    ``persistent_workers`` off for 0 (which it needs).

    Returns:
        Config: ``cfg``.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) \
            or num_workers < 0:
        raise ValueError(f'num_workers must be an int >= 0, got {num_workers!r}')
    for loader in _dicts(cfg, 'num_workers'):
        loader['num_workers'] = num_workers
        if num_workers == 0 and loader.get('persistent_workers'):
            loader['persistent_workers'] = False
    return cfg


def set_data_root(cfg: Config, data_root: str) -> Config:
    """Point every dataset of ``cfg`` (in place) at ``data_root``.

    Every dict with a ``data_root`` key (the datasets of the loaders, and of the
    loaders a hook holds, e.g. ``KNNMonitorHook``'s) gets ``data_root``, and its
    ``classes``, where it names a ``classes.txt`` file, that of ``data_root``.

    Returns:
        Config: ``cfg``.

    Raises:
        ValueError: the config holds no dataset with a ``data_root``.
    """
    if isinstance(cfg.get('data_root'), str):
        cfg.data_root = data_root  # the variable too, so that a dump reads alike
    found = _dicts(cfg, 'data_root')
    for dataset in found:
        dataset['data_root'] = data_root
        classes = dataset.get('classes')
        if isinstance(classes, str) and osp.basename(classes) == 'classes.txt':
            dataset['classes'] = osp.join(data_root, 'classes.txt')
    if not found:
        raise ValueError(f'{cfg.filename}: no dataset with a data_root to set')
    return cfg
