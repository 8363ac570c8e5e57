"""configs/mlla/: the official recipe in mmpretrain terms, and tools/train.py on
generated ImageNet-layout data."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs', 'mlla', 'mlla-tiny_32xb128-300e_in1k.py')


@pytest.mark.parametrize('size,dpr,channels,count', [
    ('tiny', 0.2, 512, 24_392_200), ('small', 0.3, 512, 43_015_048),
    ('base', 0.5, 768, 95_983_960)])
def test_recipe_and_model(size, dpr, channels, count):
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'mlla',
                                   f'mlla-{size}_32xb128-300e_in1k.py'))
    backbone = cfg.model.backbone
    assert (backbone.type, backbone.arch, backbone.drop_path_rate) == ('MLLA', size,
                                                                       dpr)
    assert cfg.model.head.in_channels == channels
    assert cfg.model.neck.type == 'GlobalAveragePooling'
    assert [a['type'] for a in cfg.model.train_cfg.augments] == ['Mixup', 'CutMix']
    assert cfg.model.head.loss.label_smooth_val == 0.1
    optim = cfg.optim_wrapper
    assert optim.optimizer.type == 'AdamW' and optim.optimizer.weight_decay == 0.05
    assert optim.optimizer.lr == pytest.approx(4e-3)  # 5e-4 * 4096 / 512
    assert optim.clip_grad.max_norm == 5.0
    assert cfg.auto_scale_lr.base_batch_size == 4096
    assert 32 * cfg.train_dataloader.batch_size == 4096
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.end, cosine.type, cosine.begin) == (
        'LinearLR', 20, 'CosineAnnealingLR', 20)
    assert cosine.eta_min == pytest.approx(4e-5)
    assert cfg.train_cfg.max_epochs == 300
    ema, graphs = cfg.custom_hooks
    assert ema.type == 'EMAHook' and ema.momentum == pytest.approx(4e-4)
    assert graphs.type == 'CUDAGraphBlocksHook'  # the stages replay from CUDA graphs
    steps = [t['type'] for t in cfg.train_dataloader.dataset.pipeline]
    assert 'RandAugment' in steps and 'RandomErasing' in steps
    erase = cfg.train_dataloader.dataset.pipeline[steps.index('RandomErasing')]
    assert erase.erase_prob == 0.25
    # MESA is named as left out, with its cost, in the leaf
    with open(osp.join(ROOT, 'configs', 'mlla', 'mlla-tiny_32xb128-300e_in1k.py')) as f:
        text = f.read()
    assert 'MESA' in text and '83.3' in text and '83.5' in text
    from mmpretrain.registry import MODELS
    import mmdinomamba  # noqa: F401
    model = MODELS.build(cfg.model)
    assert sum(p.numel() for p in model.parameters()) == count


@pytest.mark.slow
def test_train_runs_the_tiny_config(tmp_path):
    """tools/train.py on a generated ImageNet-layout folder: MLLA-T as configured,
    images shrunk to 64 px, 4 classes, 2 epochs of 2 iterations, EMA kept."""
    from mmdinomamba.datasets import make_toy_dataset
    data = str(tmp_path / 'toy')
    make_toy_dataset(data, num_classes=4, train_per_class=4, val_per_class=2, size=48,
                     formats=['imagenet'])
    work = str(tmp_path / 'work')
    options = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
               for key in (f'dataset.data_root={data}', 'num_workers=0')]
    options += ['train_dataloader.batch_size=8', 'val_dataloader.batch_size=8',
                'train_dataloader.dataset.pipeline.1.scale=64',
                'val_dataloader.dataset.pipeline.1.scale=73',
                'val_dataloader.dataset.pipeline.2.crop_size=64',
                'model.head.num_classes=4', 'data_preprocessor.num_classes=4',
                'val_evaluator.topk=(1,)', 'train_cfg.max_epochs=2',
                'param_scheduler.0.end=1', 'param_scheduler.1.begin=1',
                'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=2']
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1')
    out = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), TINY,
                          '--work-dir', work, '--cfg-options', *options],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = [d for d in os.listdir(work) if osp.isdir(osp.join(work, d))]
    with open(osp.join(work, run, 'vis_data', 'scalars.json')) as f:
        logs = [json.loads(line) for line in f]
    losses = [r['loss'] for r in logs if 'loss' in r]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert [r['accuracy/top1'] for r in logs if 'accuracy/top1' in r]
    from mmdinomamba.utils import allow_mmengine_checkpoint_types
    allow_mmengine_checkpoint_types()
    ckpt = torch.load(osp.join(work, 'epoch_2.pth'), map_location='cpu',
                      weights_only=True)
    assert 'ema_state_dict' in ckpt
    assert 'backbone.layers.3.blocks.3.attn.qk.weight' in ckpt['state_dict']
