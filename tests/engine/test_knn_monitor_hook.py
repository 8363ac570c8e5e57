"""KNNMonitorHook: the features and the k-NN it logs, against a hand computation."""
import json
import glob
import os.path as osp
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from mmpretrain.registry import HOOKS, MODELS
from PIL import Image

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.engine.hooks import KNNMonitorHook
from mmdinomamba.evaluation import knn_accuracy

from tests.helpers.toy_training import tiny_dino_config


@pytest.fixture(scope='module')
def toy_root(toy_data):
    # the simple style: the class is the object's hue, so mean colours classify
    return toy_data(num_classes=3, train_per_class=8, val_per_class=4, size=32,
                    formats=['imagenet'])


def loader_cfg(root, split):
    return dict(batch_size=5, num_workers=0,
                sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='default_collate'),
                dataset=dict(type='CustomDataset', data_root=root,
                             ann_file=f'meta/{split}.txt', data_prefix=split,
                             pipeline=[dict(type='LoadImageFromFile'),
                                       dict(type='PackInputs')]))


class MeanColour(nn.Module):
    """(batch, 3) mean of each channel: a feature a test can compute from the files."""

    def forward(self, x):
        return (x.mean(dim=(2, 3)), )


class Toy(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.data_preprocessor = MODELS.build(dict(
            type='SelfSupDataPreprocessor', mean=[10, 20, 30], std=[2, 4, 8],
            to_rgb=True))
        self.teacher = nn.ModuleDict(dict(backbone=backbone))


def fake_runner(model):
    scalars = []
    vis = types.SimpleNamespace(add_scalars=lambda d, step: scalars.append((step, d)))
    log = types.SimpleNamespace(info=lambda msg: None)
    return types.SimpleNamespace(model=model, seed=0, iter=7, logger=log,
                                 visualizer=vis), scalars


def by_hand(root, split):
    """Mean RGB of every image, normalised as the preprocessor does, in file order."""
    feats, labels = [], []
    with open(osp.join(root, 'meta', f'{split}.txt')) as f:
        for line in f:
            rel, label = line.split()
            rgb = np.asarray(Image.open(osp.join(root, split, rel)).convert('RGB'),
                             np.float64)
            feats.append((rgb - [10, 20, 30]) / [2, 4, 8])
            labels.append(int(label))
    return (torch.tensor(np.stack([f.mean(axis=(0, 1)) for f in feats])),
            torch.tensor(labels))


def test_features_and_accuracy_equal_a_hand_computation(toy_root):
    init_default_scope('mmpretrain')
    model = Toy(MeanColour()).train()
    runner, scalars = fake_runner(model)
    hook = KNNMonitorHook(loader_cfg(toy_root, 'train'), loader_cfg(toy_root, 'val'),
                          k=5)
    hook.before_train(runner)  # measures the model as it is (before_train=True)
    bank, query = by_hand(toy_root, 'train'), by_hand(toy_root, 'val')
    got_bank = hook.extract(model, hook._loaders[0])
    assert torch.equal(got_bank[1], bank[1])
    assert torch.allclose(got_bank[0].double(), bank[0], atol=1e-4)
    want = knn_accuracy(bank[0], bank[1], query[0], query[1], k=5).mean().item()
    assert len(scalars) == 1 and scalars[0][0] == 7
    assert scalars[0][1]['knn/top1'] == pytest.approx(want)
    assert hook.history == [(7, pytest.approx(want))]
    assert want > 0.5  # hue classes from mean colours: the check is not vacuous
    assert model.teacher.backbone.training  # eval mode only while measuring


def test_bad_module_and_bad_features_are_named(toy_root):
    init_default_scope('mmpretrain')
    hook = KNNMonitorHook(loader_cfg(toy_root, 'train'), loader_cfg(toy_root, 'val'),
                          module='teacher.neck')
    with pytest.raises(AttributeError, match='teacher.neck'):
        hook.before_train(fake_runner(Toy(MeanColour()))[0])

    class FeatureMap(nn.Module):
        def forward(self, x):
            return (x, )

    hook = KNNMonitorHook(loader_cfg(toy_root, 'train'), loader_cfg(toy_root, 'val'))
    with pytest.raises(ValueError, match=r'\(batch, dim\) features'):
        hook.before_train(fake_runner(Toy(FeatureMap()))[0])


@pytest.mark.parametrize('kwargs,match', [(dict(interval=0), 'interval'),
                                          (dict(k=0), 'k must'),
                                          (dict(temperature=0.0), 'temperature')])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KNNMonitorHook(dict(), dict(), **kwargs)


@pytest.mark.slow
def test_a_dino_run_logs_the_random_init_and_every_epoch(toy_root, tmp_path):
    cfg = tiny_dino_config(toy_root, str(tmp_path), max_epochs=2, num_workers=0)
    cfg.experiment_name = 'knn-monitor'
    resize = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=32),
              dict(type='PackInputs')]
    bank, query = loader_cfg(toy_root, 'train'), loader_cfg(toy_root, 'val')
    for c in (bank, query):
        c['dataset']['pipeline'] = resize
    cfg.custom_hooks = list(cfg.custom_hooks) + [
        dict(type='KNNMonitorHook', bank_dataloader=bank, query_dataloader=query)]
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, KNNMonitorHook))
    # 24 images, batches of 4: 6 iterations an epoch
    assert [it for it, _ in hook.history] == [0, 6, 12]
    assert all(0 <= acc <= 1 for _, acc in hook.history)
    scalars = glob.glob(osp.join(str(tmp_path), '*', 'vis_data', 'scalars.json'))
    with open(scalars[0]) as f:
        logged = [json.loads(line) for line in f if 'knn/top1' in line]
    assert [r['step'] for r in logged] == [0, 6, 12]
    assert [r['knn/top1'] for r in logged] == pytest.approx([a for _, a in hook.history])
    assert HOOKS.get('KNNMonitorHook') is KNNMonitorHook
