"""Every DINO pretraining and linear-probe config loads, builds and is consistent."""
import glob
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mmdinomamba  # noqa: F401  (registers our classes)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DINO = sorted(glob.glob(osp.join(ROOT, 'configs/dino/*.py')))
PROBE = sorted(glob.glob(osp.join(ROOT, 'configs/linear_probe/*.py')))
# n, the number of last blocks read out by the linear probe (Dino-Mamba's eval.sh)
PROBE_BLOCKS = {'tiny': 8, 'small': 4, 'base': 8}


def name(path):
    return osp.splitext(osp.basename(path))[0]


def build(cfg):
    """Build ``cfg.model``; DinoVim's SSD runs in its quadratic form for speed.

    On the CPU the chunked SSD pads every sequence to a 256-token chunk; the
    64 px test input has 18 tokens, where the quadratic form (same numbers) is
    much faster.
    """
    backbone = cfg.model.backbone
    if backbone.type == 'DinoVim':
        backbone.mixer_cfg = dict(backbone.get('mixer_cfg') or {}, ssd_backend='quadratic')
    return MODELS.build(cfg.model)


def test_every_model_has_both_configs():
    assert len(DINO) >= 7 and len(PROBE) >= 7  # 6 paper models + the toy
    stems = {re.sub(r'^dino_', '', name(p)).split('_')[0] for p in DINO}
    assert stems == {name(p).split('_')[0] for p in PROBE}


@pytest.mark.parametrize('path', DINO, ids=name)
def test_graph_hook_only_where_a_backbone_offers_a_stack_runner(path):
    """CUDAGraphBlocksHook comes with the DinoVim configs alone (a backbone with the
    ``stack_runner`` seam), so it never warns that it found nothing; every DinoVim
    config of the paper's recipe replays its blocks from CUDA graphs."""
    cfg = Config.fromfile(path)
    hooked = any(h.type == 'CUDAGraphBlocksHook' for h in cfg.get('custom_hooks', []))
    dinovim = cfg.model.backbone.type == 'DinoVim'
    assert hooked == (dinovim and 'in1k' in path), (hooked, cfg.model.backbone.type)


@pytest.mark.parametrize('path', DINO, ids=name)
def test_dino_config_builds(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports == dict(imports=['mmdinomamba'], allow_failed_imports=False)
    assert cfg.model.type == 'DINO'
    assert cfg.model.head.out_channels == cfg.model.loss.out_channels
    if 'in1k' in path:  # the official recipe
        assert cfg.train_dataloader.dataset.data_root == 'data/imagenet'
        assert cfg.optim_wrapper.type == 'PerParamClipAmpOptimWrapper'
        assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * 48 * 4 / 256)
        assert cfg.auto_scale_lr.base_batch_size == cfg.train_dataloader.batch_size * 4
        assert cfg.train_cfg.max_epochs == 100
        assert cfg.optim_wrapper.clip_grad.max_norm == 3.0
        crop = cfg.train_dataloader.dataset.pipeline[1]
        assert (crop.global_size, crop.local_size, crop.num_local_views) == (224, 96, 8)
    model = build(cfg).eval()
    num_student = sum(p.numel() for p in model._student().parameters())
    assert sum(p.numel() for p in model.teacher.parameters()) == num_student
    with torch.no_grad():
        feat = model.backbone(torch.zeros(1, 3, 64, 64))[-1]
        assert feat.shape == (1, cfg.model.head.in_channels)
        assert model.head(feat).shape == (1, cfg.model.head.out_channels)


@pytest.mark.parametrize('path', PROBE, ids=name)
def test_linear_probe_config_builds(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports == dict(imports=['mmdinomamba'], allow_failed_imports=False)
    backbone = cfg.model.backbone
    init = backbone.init_cfg
    assert init.type == 'Pretrained' and init.prefix == 'teacher.backbone.'
    # the default checkpoint is the last one of the matching pretraining config
    pretrain = osp.basename(osp.dirname(init.checkpoint))
    assert osp.isfile(osp.join(ROOT, 'configs/dino', pretrain + '.py')), pretrain
    assert cfg.optim_wrapper.optimizer.type == 'SGD'
    if 'in1k' in path:
        arch = backbone.get('arch', 'base')
        n = PROBE_BLOCKS[arch]
        assert list(backbone.out_indices) == list(range(-n, 0))
        assert init.checkpoint.endswith('epoch_100.pth')
        assert cfg.train_cfg.max_epochs == 100
        assert cfg.train_dataloader.dataset.data_root == 'data/imagenet'
        if backbone.type == 'DinoVim':
            assert backbone.feature_source == 'mixer'
    model = build(cfg).train()
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(k.startswith('head.') for k in trainable), trainable
    with torch.no_grad():
        logits = model(torch.zeros(2, 3, 64, 64), mode='tensor')
    assert logits.shape == (2, cfg.model.head.num_classes)
