"""Every leaf config's merged values equal the committed snapshot.

The configs are deltas on shared fragments (``_base_/`` folders); this test pins
what they merge to. ``merged_snapshots/<folder>__<name>.json`` holds, for each
leaf config (every ``configs/**/*.py`` outside a ``_base_`` folder), its
``Config.fromfile(...).to_dict()`` with tuples kept apart from lists, written
before the configs were restructured into fragments. A change to any merged
value fails here. A deliberate change (a new config, a changed default) rewrites
the snapshots, then the diff is reviewed::

    PYTHONPATH=.:tests/configs python -c "import test_merged_configs as t; \
        t.write_snapshots(t.SNAPSHOTS)"

One documented difference: the layer-decay configs now give the rate once per
recipe (``layer_decay_rate`` per block of a 12-block backbone plus
``reference_num_layers=12``) instead of ``0.65 ** (12 / 24)`` in every 24-block
leaf, so their ``optim_wrapper.paramwise_cfg`` differs from the snapshot. For
them the optimizer is built for the config's backbone at its own depth but 32
channels wide (the lr of a parameter depends on its layer and the depth only)
and every parameter group's lr must equal the lr of its layer recorded by the
old code in ``merged_snapshots/layer_decay_lrs.json``. Both sides compute
``lr * rate ** k`` from the same floats (``0.65 ** (12 / 24)`` is the same
operation inside the constructor, and ``0.65 ** (12 / 12)`` is 0.65), so they
must agree exactly.
"""
import copy
import functools
import glob
import importlib
import json
import os
import os.path as osp
from typing import Dict, List, Optional

import mmengine.config.utils
import pytest
import torch.nn as nn
from mmengine.config import Config

import mmdinomamba  # noqa: F401  (registers our classes)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(ROOT, 'configs')
SNAPSHOTS = osp.join(osp.dirname(osp.abspath(__file__)), 'merged_snapshots')
LR_SNAPSHOT = osp.join(SNAPSHOTS, 'layer_decay_lrs.json')
WIDTH = 32
# keys whose merged value may differ from the snapshot (see the module docstring)
LAYER_DECAY_KEY = ('optim_wrapper', 'paramwise_cfg')


def leaf_configs(config_root: str = CONFIGS) -> List[str]:
    """Every config under ``config_root`` that is not a ``_base_`` fragment."""
    paths = glob.glob(osp.join(config_root, '**', '*.py'), recursive=True)
    return sorted(p for p in paths
                  if '_base_' not in osp.relpath(p, config_root).split(os.sep))


def snapshot_name(path: str, config_root: str = CONFIGS) -> str:
    return osp.splitext(osp.relpath(path, config_root))[0].replace(os.sep, '__')


def plain(value):
    """A config value as JSON, tuples marked so that a tuple -> list change shows."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {'__tuple__': [plain(v) for v in value]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f'unexpected config value {value!r} of type {type(value)}')


def load(path: str) -> Config:
    return Config.fromfile(path, format_python_code=False)


def merged(path: str) -> dict:
    """The merged config as JSON-able values (``$DATA_ROOT`` must be unset)."""
    return plain(load(path).to_dict())


def tiny_backbone(backbone: dict) -> dict:
    """The backbone config at its own depth, 32 channels wide, without weights."""
    registry = importlib.import_module('mmdinomamba.models')
    backbone = copy.deepcopy(backbone)
    kind = backbone['type'].split('.')[-1]
    if kind == 'VisionTransformer':
        from mmpretrain.models import VisionTransformer as cls
    else:
        cls = getattr(registry, kind)
    arch = backbone['arch']
    depth = arch['num_layers'] if isinstance(arch, dict) else \
        cls.arch_zoo[arch.lower()]['num_layers']
    arch = dict(embed_dims=WIDTH, num_layers=depth)
    if kind == 'DinoVim':
        backbone['mixer_cfg'] = dict(d_state=16, headdim=16)
    elif kind == 'LinearViT':
        arch.update(num_heads=2, mlp_ratio=2)
    else:
        arch.update(num_heads=2, feedforward_channels=2 * WIDTH)
    backbone.update(arch=arch, init_cfg=None)
    return backbone


def layer_decay_lrs(path: str) -> Optional[List[float]]:
    """The lr of each layer id (0 = embeddings ... last = head) that the config's
    optimizer constructor gives a 32-wide backbone of the config's depth, or
    None for configs without layer decay."""
    cfg = load(path)
    optim = cfg.get('optim_wrapper') or {}
    if optim.get('constructor') != 'LayerDecayOptimWrapperConstructor':
        return None
    from mmdinomamba.engine import LayerDecayOptimWrapperConstructor
    scope = cfg.default_scope
    models = importlib.import_module(f'{scope}.registry').MODELS
    with models.switch_scope_and_registry(scope) as registry:
        backbone = registry.build(tiny_backbone(cfg.model.backbone))
    model = nn.Module()
    model.backbone = backbone
    model.head = nn.Linear(WIDTH, 2)
    optim = copy.deepcopy(optim.to_dict())
    constructor = LayerDecayOptimWrapperConstructor(
        dict(type=optim['type'], optimizer=optim['optimizer']), optim['paramwise_cfg'])
    lrs: Dict[int, float] = {}
    for group in constructor(model).optimizer.param_groups:
        assert lrs.setdefault(group['layer_id'], group['lr']) == group['lr']
    assert sorted(lrs) == list(range(len(lrs)))
    return [lrs[i] for i in range(len(lrs))]


def write_snapshots(out_dir: str, config_root: str = CONFIGS) -> None:
    """Write the snapshots of every leaf config under ``config_root``."""
    if 'DATA_ROOT' in os.environ:
        raise ValueError('unset DATA_ROOT first: the snapshots hold the default roots')
    os.makedirs(out_dir, exist_ok=True)
    lrs = {}
    for path in leaf_configs(config_root):
        name = snapshot_name(path, config_root)
        with open(osp.join(out_dir, name + '.json'), 'w') as f:
            json.dump(merged(path), f, indent=1, sort_keys=True)
            f.write('\n')
        table = layer_decay_lrs(path)
        if table is not None:
            lrs[name] = table
    with open(osp.join(out_dir, 'layer_decay_lrs.json'), 'w') as f:
        json.dump(lrs, f, indent=1, sort_keys=True)
        f.write('\n')


@pytest.fixture(scope='module', autouse=True)
def parse_each_config_once():
    """Each config is read by two tests; resolving ``mmseg::``/``mmdet::`` bases
    also parses every model-zoo metafile of the package (see test_dense_configs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mmengine.config.utils, 'load',
                      functools.lru_cache(maxsize=None)(mmengine.config.utils.load))
        patch.setitem(globals(), 'load', functools.lru_cache(maxsize=None)(load))
        yield


@pytest.fixture(autouse=True)
def no_data_root(monkeypatch):
    """The dense configs read ``$DATA_ROOT``; the snapshot is of the defaults."""
    monkeypatch.delenv('DATA_ROOT', raising=False)


def load_json(path: str):
    with open(path) as f:
        return json.load(f)


def differences(new, old, key: str = '') -> List[str]:
    """Dotted keys whose values differ between two JSON trees."""
    if isinstance(new, dict) and isinstance(old, dict):
        out = []
        for k in sorted(set(new) | set(old)):
            sub = f'{key}.{k}' if key else k
            if k not in new or k not in old:
                out.append(f'{sub} ({"added" if k in new else "removed"})')
            else:
                out += differences(new[k], old[k], sub)
        return out
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [d for i, (a, b) in enumerate(zip(new, old))
                for d in differences(a, b, f'{key}.{i}')]
    return [] if new == old and type(new) is type(old) else [key]


def test_every_leaf_has_a_snapshot():
    leaves = {snapshot_name(p) for p in leaf_configs()}
    stored = {osp.splitext(n)[0] for n in os.listdir(SNAPSHOTS)} - {'layer_decay_lrs'}
    assert leaves == stored


@pytest.mark.parametrize('path', leaf_configs(), ids=snapshot_name)
def test_merged_values_are_unchanged(path):
    new = merged(path)
    old = load_json(osp.join(SNAPSHOTS, snapshot_name(path) + '.json'))
    lr_tables = load_json(LR_SNAPSHOT)
    if snapshot_name(path) in lr_tables:  # compared by their lrs, below
        section, key = LAYER_DECAY_KEY
        new[section].pop(key)
        old[section].pop(key)
    assert differences(new, old) == []


@pytest.mark.parametrize('path', leaf_configs(), ids=snapshot_name)
def test_layer_decay_lrs_are_unchanged(path):
    """Each layer's lr as the old code gave it (None: no layer decay, then or now)."""
    assert layer_decay_lrs(path) == load_json(LR_SNAPSHOT).get(snapshot_name(path))


def test_differences_sees_every_kind_of_change():
    """The comparison itself: a value, a type (tuple vs list), a key, a length."""
    old = plain(dict(a=1, b=(1, 2), c=dict(d=[1, 2]), e='x'))
    assert differences(old, old) == []
    assert differences(plain(dict(a=2, b=(1, 2), c=dict(d=[1, 2]), e='x')), old) == ['a']
    assert differences(plain(dict(a=1, b=[1, 2], c=dict(d=[1, 2]), e='x')), old) == ['b']
    assert differences(plain(dict(a=1, b=(1, 2), c=dict(d=[1]), e='x')), old) == ['c.d']
    assert differences(plain(dict(a=1, b=(1, 2), c=dict(d=[1, 2]))), old) == \
        ['e (removed)']
    assert differences(plain(dict(a=1.0, b=(1, 2), c=dict(d=[1, 2]), e='x')), old) == \
        ['a']
