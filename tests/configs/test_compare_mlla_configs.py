"""configs/compare/: the MLLA-style entry (PlainMLLA) shares everything with the
other three models but its backbone, its probe mirrors theirs, and its DINO run
trains through tools/train.py on the rich toy data."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COMPARE = osp.join(ROOT, 'configs', 'compare')
DINO = osp.join(COMPARE, 'dino_mlla-d192-l12-p8_1xb128-20e_toy-rich.py')
PROBE = osp.join(COMPARE, 'linear-probe_mlla-d192-l12-p8_1xb128-30e_toy-rich.py')


def without_backbone(path):
    d = Config.fromfile(path).to_dict()
    backbone = d['model'].pop('backbone')
    d.pop('filename', None)
    return backbone, json.dumps(d, sort_keys=True, default=str)


def test_only_the_backbone_differs_from_the_other_models():
    mlla, rest = without_backbone(DINO)
    for other in ('vit', 'dinovim', 'linearvit'):
        backbone, other_rest = without_backbone(
            osp.join(COMPARE, f'dino_{other}-d192-l12-p8_1xb128-20e_toy-rich.py'))
        assert other_rest == rest, other
        assert (backbone['img_size'], backbone['patch_size']) == (64, 8)
        assert backbone['arch']['embed_dims'] == 192
        assert backbone['arch']['num_layers'] == 12
    assert mlla['type'] == 'PlainMLLA' and mlla['out_type'] == 'cls_token'
    assert (mlla['img_size'], mlla['patch_size']) == (64, 8)
    assert mlla['arch'] == dict(embed_dims=192, num_layers=12, num_heads=6, mlp_ratio=4)


def test_the_probe_reads_the_dino_runs_backbone():
    dino = Config.fromfile(DINO).model.backbone.to_dict()
    probe = Config.fromfile(PROBE).model.backbone.to_dict()
    assert probe.pop('out_indices') == [-4, -3, -2, -1]
    assert probe.pop('frozen_stages') == 12
    assert probe.pop('feature_source') == 'normed'
    init = probe.pop('init_cfg')
    assert init == dict(type='Pretrained', prefix='teacher.backbone.', strict=True,
                        checkpoint='work_dirs/compare/mlla/epoch_20.pth')
    assert probe == dino
    linearvit = Config.fromfile(osp.join(
        COMPARE, 'linear-probe_linearvit-d192-l12-p8_1xb128-30e_toy-rich.py'))
    probe_cfg = Config.fromfile(PROBE)
    assert probe_cfg.model.neck == linearvit.model.neck
    assert probe_cfg.model.head == linearvit.model.head


@pytest.mark.slow
def test_dino_trains_through_the_tool(tmp_path):
    """Two blocks, a 64-wide head, two epochs of 3 iterations (24 images, batches
    of 8) on the CPU: a warm-up epoch and one of the cosine, which ends with the
    run (a one-epoch run would leave the cosine, begun after the warm-up, empty);
    the k-NN monitor runs before the first step."""
    from mmdinomamba.datasets import make_toy_dataset
    data = str(tmp_path / 'toy_rich')
    make_toy_dataset(data, num_classes=12, train_per_class=2, val_per_class=1,
                     size=64, formats=('imagenet', ), style='rich')
    work = str(tmp_path / 'work')
    options = [
        f'train_dataloader.dataset.data_root={data}',
        f'custom_hooks.3.bank_dataloader.dataset.data_root={data}',
        f'custom_hooks.3.query_dataloader.dataset.data_root={data}',
        'custom_hooks.3.bank_dataloader.num_workers=0',
        'custom_hooks.3.query_dataloader.num_workers=0',
        'optim_wrapper.type=PerParamClipOptimWrapper', 'train_cfg.max_epochs=2',
        'param_scheduler.0.end=1', 'param_scheduler.1.begin=1',
        'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'model.backbone.arch.num_layers=2', 'model.head.out_channels=64',
        'model.loss.out_channels=64', 'default_hooks.logger.interval=1']
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1')
    out = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), DINO,
                          '--work-dir', work, '--cfg-options', *options],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'k-NN (k=20, T=0.07) of teacher.backbone at iteration 0' in out.stdout + \
        out.stderr
    [run] = [d for d in os.listdir(work) if osp.isdir(osp.join(work, d))]
    with open(osp.join(work, run, 'vis_data', 'scalars.json')) as f:
        losses = [json.loads(line)['loss'] for line in f if '"loss"' in line]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    from mmdinomamba.utils import allow_mmengine_checkpoint_types
    allow_mmengine_checkpoint_types()
    ckpt = torch.load(osp.join(work, 'epoch_2.pth'), map_location='cpu',
                      weights_only=True)['state_dict']
    teacher = {k[len('teacher.'):]: v for k, v in ckpt.items()
               if k.startswith('teacher.backbone.')}
    student = {k: v for k, v in ckpt.items() if k.startswith('backbone.')}
    assert sorted(teacher) == sorted(student)
    assert 'backbone.layers.1.attn.qk.weight' in student
    # the student took optimiser steps; the teacher is its moving average
    assert any(not torch.equal(v, student[k]) for k, v in teacher.items())
