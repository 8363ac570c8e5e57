"""Every leaf config: the values that matter, its layer-decay rates, and that it
builds.

A leaf is every ``configs/**/*.py`` outside a ``_base_`` folder. Each belongs to
one family (:data:`FAMILIES`), whose recipe numbers and data roots it must hold:
the paper's DINO and linear-probe recipes (the paper and the official Dino-Mamba
code), the dense recipes (the plain backbones' with layer-wise lr decay, MLLA's
official Swin-style ones without), the Binary-AUC and robustness evaluations,
MLLA's classification recipe, and the toy recipes of ``make demo`` and the
comparison. Incidental values (a logger's interval, a visualiser) are not pinned.
The layer-decay rates of the families that use layer decay are checked on the
optimizer the config's constructor builds for a 32-wide backbone of the config's
depth, against the closed form ``lr * rate ** (depth + 1 - layer)``.
"""
import copy
import importlib
import os.path as osp
import re
from typing import Callable, Dict

import pytest
import torch.nn as nn
from mmengine.config import Config, ConfigDict

import mmdinomamba  # noqa: F401  (registers our classes)
from tests.helpers.configs import CONFIGS, leaf_configs, leaf_id, load

WIDTH = 32
DEPTH = {'tiny': 24, 'small': 24, 'base': 24}  # DinoVim presets
WIDTHS = {'tiny': 256, 'small': 512, 'base': 768}


@pytest.fixture(autouse=True)
def no_data_root(monkeypatch):
    """The dense configs read ``$DATA_ROOT``; the defaults are checked."""
    monkeypatch.delenv('DATA_ROOT', raising=False)


def get(cfg, key: str):
    """``cfg`` at a dotted key (list entries by number)."""
    node = cfg
    for part in key.split('.'):
        node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    return node


def data_roots(cfg: Config) -> set:
    """The data root of every dataset of the config (loaders and hooks)."""
    found = set()

    def visit(node):
        if isinstance(node, dict):
            if 'data_root' in node:
                found.add(node['data_root'])
            for value in node.values():
                visit(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                visit(value)

    for key in cfg.keys():
        if key != 'data_root':
            visit(cfg[key])
    return found


def hook(cfg: Config, kind: str) -> dict:
    found = [h for h in cfg.get('custom_hooks', []) if h.type == kind]
    assert len(found) == 1, (kind, [h.type for h in cfg.get('custom_hooks', [])])
    return found[0]


def schedulers(cfg: Config) -> Dict[str, dict]:
    """The param schedulers by what they do: 'warmup', 'lr', 'weight_decay'."""
    out = {}
    for s in cfg.param_scheduler:
        role = s.get('param_name', 'lr')
        out['warmup' if s.type == 'LinearLR' else role] = s
    return out


def arch_of(path: str) -> str:
    return re.search(r'-(tiny|small|base)-', osp.basename(path)).group(1)


def mlla_arch(path: str) -> str:
    return re.search(r'_mlla-(tiny|small|base)_', osp.basename(path)).group(1)


# -- the families ------------------------------------------------------------------------

def dino_in1k(path, cfg):
    """The official Dino-Mamba DINO recipe (the paper and github yangtiming/Dino-Mamba)."""
    assert data_roots(cfg) == {'data/imagenet'}
    assert cfg.train_dataloader.batch_size == 48
    assert cfg.optim_wrapper.type == 'PerParamClipAmpOptimWrapper'
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.weight_decay) == ('AdamW', 0.04)
    assert opt.lr == pytest.approx(5e-4 * 48 * 4 / 256)
    assert cfg.optim_wrapper.clip_grad.max_norm == 3.0
    assert cfg.train_cfg.max_epochs == 100
    s = schedulers(cfg)
    assert (s['warmup'].begin, s['warmup'].end) == (0, 10)
    assert (s['lr'].begin, s['lr'].end, s['lr'].eta_min) == (10, 100, 1e-6)
    assert s['weight_decay'].eta_min_ratio == 10.0  # 0.04 -> 0.4
    model = cfg.model
    assert model.head.out_channels == model.loss.out_channels == 65536
    assert (model.loss.student_temp, model.loss.teacher_temp,
            model.loss.center_momentum) == (0.1, 0.04, 0.9)
    momentum = hook(cfg, 'DINOTeacherMomentumHook')
    assert (momentum.base_momentum, momentum.final_momentum) == (0.996, 1.0)
    assert hook(cfg, 'DINOFreezeLastLayerHook').freeze_epochs == 1
    crop, = [t for t in cfg.train_pipeline if t.type == 'DINOMultiCrop']
    assert (crop.global_size, crop.local_size, crop.num_local_views) == (224, 96, 8)
    backbone = model.backbone
    if backbone.type == 'DinoVim':
        arch = arch_of(path)
        assert backbone.arch == arch and model.head.in_channels == WIDTHS[arch]
        assert backbone.get('num_registers', 0) == (12 if 'reg' in path else 0)
    else:
        assert backbone.type in ('LinearViT', 'mmpretrain.VisionTransformer')
        assert backbone.arch == 'base' and model.head.in_channels == 768
    if '-compile-' in path:
        hook(cfg, 'CompileModulesHook')


def probe_in1k(path, cfg):
    """DINO's linear probe: SGD, 100 epochs, the last n blocks (8 for T and B, 4
    for S), weight decay 0 / 1e-3 / 1e-2 (T / S / B), on the teacher of the
    pretraining run."""
    assert data_roots(cfg) <= {'data/imagenet', 'data/imagenet-a', 'data/imagenet-r',
                               'data/imagenet-sketch'}
    assert cfg.train_dataloader.dataset.data_root == 'data/imagenet'
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'SGD' and opt.momentum == 0.9
    assert opt.lr == pytest.approx(0.001 * 128 * 4 / 256)
    assert cfg.train_cfg.max_epochs == 100
    backbone = cfg.model.backbone
    arch = arch_of(path) if backbone.type == 'DinoVim' else 'base'
    blocks = {'tiny': 8, 'small': 4, 'base': 8}[arch]
    assert opt.weight_decay == {'tiny': 0.0, 'small': 1e-3, 'base': 1e-2}[arch]
    assert list(backbone.out_indices) == list(range(-blocks, 0))
    width = WIDTHS[arch]
    assert cfg.model.neck.in_channels == cfg.model.head.in_channels == width * blocks
    assert backbone.frozen_stages == (24 if backbone.type == 'DinoVim' else 12)
    init = backbone.init_cfg
    assert init.prefix == 'teacher.backbone.' and init.checkpoint.endswith('epoch_100.pth')
    assert osp.isfile(osp.join(CONFIGS, 'dino', osp.basename(osp.dirname(
        init.checkpoint)) + '.py'))


def robustness(path, cfg):
    """A probe on another test set: the probe's recipe, the set's data root."""
    probe_in1k(path, cfg)
    test_set = re.search(r'_(in-[a-z]+)\.py$', path).group(1)
    root = {'in-a': 'data/imagenet-a', 'in-r': 'data/imagenet-r',
            'in-sketch': 'data/imagenet-sketch', 'in-real': 'data/imagenet'}[test_set]
    assert cfg.test_dataloader.dataset.data_root == root


def layer_decay_recipe(rate: float, epochs=None, iters=None):
    def check(path, cfg):
        opt = cfg.optim_wrapper
        assert opt.constructor == 'LayerDecayOptimWrapperConstructor'
        assert opt.paramwise_cfg == dict(layer_decay_rate=rate, reference_num_layers=12)
        assert (opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay) == (
            'AdamW', 1e-4, 0.05)
        if epochs is not None:
            assert cfg.train_cfg.max_epochs == epochs
        else:
            assert cfg.train_cfg.max_iters == iters
        init = cfg.model.backbone.init_cfg
        assert init.type == 'Pretrained' and not osp.isabs(init.checkpoint)
    return check


def upernet(path, cfg):
    """UperNet on ADE20K: 160k iterations, 512 crops, layer decay 0.65."""
    layer_decay_recipe(0.65, iters=160000)(path, cfg)
    assert data_roots(cfg) == {'data/ade/ADEChallengeData2016'}
    assert tuple(cfg.crop_size) == (512, 512)


def cascade(path, cfg):
    """Cascade Mask R-CNN on COCO: 12 or 36 epochs, layer decay 0.7."""
    layer_decay_recipe(0.7, epochs=36 if 'ms-3x' in path else 12)(path, cfg)
    assert data_roots(cfg) == {'data/coco/'}


def mlla_dense_backbone(path, cfg, drop_path_rate: float) -> list:
    """An MLLA of the file name's size from its official ImageNet-1k weights, its
    four stages out; returns the stages' widths."""
    from mmdinomamba.models import MLLA
    arch = mlla_arch(path)
    backbone = cfg.model.backbone
    assert (backbone.type, backbone.arch) == ('MLLA', arch)
    assert tuple(backbone.out_indices) == (0, 1, 2, 3)
    assert backbone.drop_path_rate == drop_path_rate
    assert backbone.init_cfg == dict(type='Pretrained',
                                     checkpoint=f'checkpoints/mlla-{arch}_in1k.pth')
    return [MLLA.arch_zoo[arch]['embed_dims'] * 2 ** i for i in range(4)]


def swin_recipe(cfg, lr: float, weight_decay: float):
    """The optimizer of MLLA's official dense configs (Swin's): AdamW, no weight
    decay on norms, no layer-wise lr decay."""
    opt = cfg.optim_wrapper
    assert opt.type == 'OptimWrapper' and 'constructor' not in opt
    assert opt.optimizer == dict(type='AdamW', lr=lr, betas=(0.9, 0.999),
                                 weight_decay=weight_decay)
    assert opt.paramwise_cfg == dict(custom_keys={'norm': dict(decay_mult=0.0)})


def upernet_mlla(path, cfg):
    """MLLA's official UperNet on ADE20K (mlla_b_upernet.py, Swin's recipe): AdamW
    6e-5, weight decay 0.01, 1500 warm-up iterations from 1e-6 then poly to 0 at
    160k, 8 x 2 images, 512 crops; drop path 0.5 for B (the official setting),
    0.2 / 0.3 for T / S (their classification rates)."""
    swin_recipe(cfg, lr=6e-5, weight_decay=0.01)
    warmup, poly = cfg.param_scheduler
    assert (warmup.type, warmup.start_factor, warmup.by_epoch, warmup.begin,
            warmup.end) == ('LinearLR', 1e-6, False, 0, 1500)
    assert (poly.type, poly.power, poly.eta_min, poly.by_epoch, poly.begin,
            poly.end) == ('PolyLR', 1.0, 0.0, False, 1500, 160000)
    assert cfg.train_cfg.max_iters == 160000 and cfg.train_dataloader.batch_size == 2
    assert data_roots(cfg) == {'data/ade/ADEChallengeData2016'}
    assert tuple(cfg.crop_size) == (512, 512)
    widths = mlla_dense_backbone(
        path, cfg, {'tiny': 0.2, 'small': 0.3, 'base': 0.5}[mlla_arch(path)])
    head, aux = cfg.model.decode_head, cfg.model.auxiliary_head
    assert list(head.in_channels) == widths and aux.in_channels == widths[2]
    assert head.num_classes == aux.num_classes == 150


def mask_rcnn(path, cfg):
    """MLLA's official Mask R-CNN on COCO (mlla_{t,s,b}_mrcnn_{1x,3x}.py): AdamW
    1e-4, weight decay 0.05, 500 warm-up iterations from 1e-3, 12 epochs (steps at
    8, 11) or 36 (27, 33) of 8 x 2 images, drop path 0.1 or 0.3, and the DETR
    multi-scale + crop augmentation."""
    swin_recipe(cfg, lr=1e-4, weight_decay=0.05)
    three_x = 'crop-3x' in path
    epochs, milestones = (36, [27, 33]) if three_x else (12, [8, 11])
    warmup, steps = cfg.param_scheduler
    assert (warmup.type, warmup.start_factor, warmup.by_epoch, warmup.begin,
            warmup.end) == ('LinearLR', 0.001, False, 0, 500)
    assert (steps.type, steps.by_epoch, steps.begin, steps.end, steps.gamma) == (
        'MultiStepLR', True, 0, epochs, 0.1)
    assert list(steps.milestones) == milestones
    assert cfg.train_cfg.max_epochs == epochs and cfg.train_dataloader.batch_size == 2
    assert data_roots(cfg) == {'data/coco/'}
    widths = mlla_dense_backbone(path, cfg, 0.3 if three_x else 0.1)
    model = cfg.model
    assert model.type == 'MaskRCNN' and list(model.neck.in_channels) == widths
    assert model.roi_head.bbox_head.num_classes == 80
    assert model.roi_head.mask_head.num_classes == 80
    choice, = [t for t in cfg.train_dataloader.dataset.pipeline
               if t.type == 'RandomChoice']
    short_sides = list(range(480, 801, 32))
    multi_scale, crop = choice.transforms
    assert [t.type for t in multi_scale] == ['RandomChoiceResize']
    assert [s for _, s in multi_scale[0].scales] == short_sides
    assert [t.type for t in crop] == ['RandomChoiceResize', 'RandomCrop',
                                      'RandomChoiceResize']
    assert [s for _, s in crop[0].scales] == [400, 500, 600]
    assert (crop[1].crop_type, tuple(crop[1].crop_size)) == ('absolute_range',
                                                             (384, 600))
    assert [s for _, s in crop[2].scales] == short_sides
    assert all(long == 1333 for t in (multi_scale[0], crop[0], crop[2])
               for long, _ in t.scales)


def binary_auc(path, cfg):
    """Binary-AUC of the last block's map on a segmentation set."""
    root = ('data/toy/ade' if path.endswith('toy-ade.py') else 'data/toy'
            if path.endswith('_toy.py') else 'data/VOCdevkit/VOC2012'
            if 'voc12' in path else 'data/ImageNetS/ImageNetS919')
    assert data_roots(cfg) == {root}
    assert cfg.model.type == 'ActivationMapModel' and cfg.model.layer == -1
    assert cfg.model.method == ('attention' if 'attn' in path else 'cosine')


def mlla(path, cfg):
    """MLLA's ImageNet recipe (AdamW 5e-4 x 4096 / 512, 300 epochs, clip 5)."""
    assert data_roots(cfg) == {'data/imagenet'}
    opt = cfg.optim_wrapper
    assert opt.optimizer.lr == pytest.approx(5e-4 * 4096 / 512)
    assert (opt.optimizer.type, opt.optimizer.weight_decay) == ('AdamW', 0.05)
    assert opt.clip_grad.max_norm == 5.0
    assert cfg.train_cfg.max_epochs == 300
    assert schedulers(cfg)['warmup'].end == 20


def toy_dino(path, cfg):
    """make demo's DINO run: 10 epochs of 8 images on the toy data, one warm-up
    epoch, teacher 0.96 -> 1, prototypes frozen for the whole run."""
    assert data_roots(cfg) == {'data/toy'}
    assert cfg.train_cfg.max_epochs == 10 and cfg.train_dataloader.batch_size == 8
    assert cfg.optim_wrapper.type == 'PerParamClipOptimWrapper'
    assert cfg.optim_wrapper.optimizer.lr == 5e-4
    s = schedulers(cfg)
    assert s['warmup'].end == s['lr'].begin == 1 and 'end' not in s['lr']
    assert cfg.model.head.out_channels == 1024 and cfg.model.teacher_momentum == 0.96
    assert hook(cfg, 'DINOFreezeLastLayerHook').freeze_epochs == 10
    hook(cfg, 'InitialWeightsHook')
    assert cfg.model.backbone.arch == dict(embed_dims=64, num_layers=4)


def toy_probe(path, cfg):
    assert data_roots(cfg) == {'data/toy'}
    assert cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 10
    assert cfg.optim_wrapper.optimizer.lr == 0.01
    assert list(cfg.model.backbone.out_indices) == [-2, -1]
    assert cfg.model.head.num_classes == 4


def compare_dino(path, cfg):
    """The comparison's DINO runs: 20 epochs of 128 images, two warm-up epochs."""
    assert data_roots(cfg) == {'data/toy_rich_compare'}
    assert cfg.train_cfg.max_epochs == 20 and cfg.train_dataloader.batch_size == 128
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * 128 / 256)
    s = schedulers(cfg)
    assert s['warmup'].end == s['lr'].begin == 2
    assert cfg.model.head.out_channels == 4096 and cfg.model.teacher_momentum == 0.99
    hook(cfg, 'KNNMonitorHook')
    hook(cfg, 'InitialWeightsHook')


def compare_probe(path, cfg):
    assert data_roots(cfg) == {'data/toy_rich_compare'}
    assert cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 30
    assert cfg.optim_wrapper.optimizer.lr == 0.05
    assert cfg.model.head.num_classes == 12


def compare_dino_seq256(path, cfg):
    """The comparison at 256 tokens: 4 px patches on the 64 px images, 6 epochs of
    64 images, one warm-up epoch, the k-NN every 3 epochs."""
    assert data_roots(cfg) == {'data/toy_rich_seq256'}
    backbone = cfg.model.backbone
    assert (backbone.img_size // backbone.patch_size) ** 2 == 256
    assert cfg.train_cfg.max_epochs == 6 and cfg.train_dataloader.batch_size == 64
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * 64 / 256)
    s = schedulers(cfg)
    assert s['warmup'].end == s['lr'].begin == 1
    assert cfg.model.head.out_channels == 4096 and cfg.model.teacher_momentum == 0.99
    assert hook(cfg, 'KNNMonitorHook').interval == 3
    hook(cfg, 'InitialWeightsHook')


def compare_probe_seq256(path, cfg):
    assert data_roots(cfg) == {'data/toy_rich_seq256'}
    backbone = cfg.model.backbone
    assert (backbone.img_size // backbone.patch_size) ** 2 == 256
    assert cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 5
    assert cfg.optim_wrapper.optimizer.lr == 0.05
    assert cfg.model.head.num_classes == 12


def analysis(path, cfg):
    """A backbone for the rank tools, no data."""
    assert data_roots(cfg) == set()
    backbone = cfg.model.get('backbone', cfg.model)
    assert backbone.type in ('DinoVim', 'LinearViT', 'mmpretrain.VisionTransformer')


FAMILIES: Dict[str, Callable] = {
    r'dino/dino_.*_in1k': dino_in1k,
    r'linear_probe/.*_in1k': probe_in1k,
    r'robustness/': robustness,
    r'upernet/upernet_(?!mlla-)': upernet,
    r'upernet/upernet_mlla-': upernet_mlla,
    r'cascade_mask_rcnn/': cascade,
    r'mask_rcnn/': mask_rcnn,
    r'binary_auc/': binary_auc,
    r'mlla/': mlla,
    r'dino/dino_dinovim-toy': toy_dino,
    r'linear_probe/dinovim-toy': toy_probe,
    r'compare/dino_.*-p8_': compare_dino,
    r'compare/linear-probe_.*-p8_': compare_probe,
    r'compare/dino_.*-p4_': compare_dino_seq256,
    r'compare/linear-probe_.*-p4_': compare_probe_seq256,
    r'analysis/': analysis,
}


def families_of(path: str) -> list:
    return [check for pattern, check in FAMILIES.items()
            if re.match(pattern, leaf_id(path))]


@pytest.mark.parametrize('path', leaf_configs(), ids=leaf_id)
def test_values_that_matter(path):
    families = families_of(path)
    assert len(families) == 1, f'{leaf_id(path)}: in {len(families)} families'
    cfg = load(path)
    if 'model' in cfg and 'default_scope' in cfg:
        assert cfg.custom_imports.imports == ['mmdinomamba']
    families[0](path, cfg)


# -- layer decay -------------------------------------------------------------------------

def tiny_backbone(backbone: dict) -> dict:
    """A plain backbone's config at its own depth, 32 channels wide, without
    weights (a hierarchical one, MLLA, as configured)."""
    backbone = copy.deepcopy(backbone)
    kind = backbone['type'].split('.')[-1]
    if kind == 'MLLA':
        return backbone
    if kind == 'VisionTransformer':
        from mmpretrain.models import VisionTransformer as cls
    else:
        cls = getattr(importlib.import_module('mmdinomamba.models'), kind)
    arch = backbone['arch']
    depth = arch['num_layers'] if isinstance(arch, dict) else \
        cls.arch_zoo[arch.lower()]['num_layers']
    arch = dict(embed_dims=WIDTH, num_layers=depth)
    if kind == 'DinoVim':
        backbone['mixer_cfg'] = dict(d_state=16, headdim=16)
    elif kind in ('LinearViT', 'PlainMLLA'):
        arch.update(num_heads=2, mlp_ratio=2)
    else:
        arch.update(num_heads=2, feedforward_channels=2 * WIDTH)
    backbone.update(arch=arch, init_cfg=None)
    return backbone


def build_in_scope(cfg: Config, model_cfg: dict):
    scope = cfg.get('default_scope') or 'mmpretrain'
    models = importlib.import_module(f'{scope}.registry').MODELS
    with models.switch_scope_and_registry(scope) as registry:
        return registry.build(model_cfg)


# the families whose recipe has layer-wise lr decay (MLLA's dense recipes have none)
LAYER_DECAY = [p for p in leaf_configs() if families_of(p) in ([upernet], [cascade])]


@pytest.mark.parametrize('path', LAYER_DECAY, ids=leaf_id)
def test_layer_decay_rates(path):
    """Each layer's lr: ``lr * rate ** (depth + 1 - layer)`` with ``rate =
    layer_decay_rate ** (12 / depth)`` (the rate is given per block of a 12-block
    backbone)."""
    from mmdinomamba.engine import LayerDecayOptimWrapperConstructor
    cfg = load(path)
    optim = cfg.optim_wrapper.to_dict()
    model = nn.Module()
    model.backbone = build_in_scope(cfg, tiny_backbone(cfg.model.backbone))
    model.head = nn.Linear(WIDTH, 2)
    constructor = LayerDecayOptimWrapperConstructor(
        dict(type=optim['type'], optimizer=optim['optimizer']), optim['paramwise_cfg'])
    depth = len(model.backbone.layers)
    rate = optim['paramwise_cfg']['layer_decay_rate'] ** (12 / depth)
    lr = optim['optimizer']['lr']
    layers = set()
    for group in constructor(model).optimizer.param_groups:
        layer = group['layer_id']
        layers.add(layer)
        assert group['lr'] == pytest.approx(lr * rate ** (depth + 1 - layer), rel=1e-12)
    assert layers == set(range(depth + 2))


# -- every leaf builds -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('path', leaf_configs(), ids=leaf_id)
def test_every_leaf_builds(path):
    """The leaf's model, built in its scope with a 32-wide backbone of its own
    depth (every other part as configured)."""
    cfg = load(path)
    model_cfg = cfg.model  # a ConfigDict: mmdet reads its train_cfg by attribute
    if 'backbone' in model_cfg:
        model_cfg.backbone = ConfigDict(tiny_backbone(model_cfg.backbone.to_dict()))
    else:
        model_cfg = ConfigDict(tiny_backbone(model_cfg.to_dict()))
    model = build_in_scope(cfg, model_cfg)
    assert sum(p.numel() for p in model.parameters()) > 0
