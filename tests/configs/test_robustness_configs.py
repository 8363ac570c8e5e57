"""configs/robustness: one config per ImageNet linear probe and robustness set.

Each must be its probe's config with only the test dataloader's dataset and the
test evaluator replaced; the datasets and evaluators build on generated data in
the published layouts, every backbone builds (on the meta device), and a tiny
DinoVim runs through tools/test.py with a checkpoint whose predictions are known.
"""
import copy
import functools
import glob
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import Evaluator
from mmengine.registry import DefaultScope
from mmpretrain.registry import DATASETS, MODELS

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.evaluation.robustness import BACKBONE_NAMES, ROBUSTNESS_SETS

from tests.helpers.robustness_data import (ROBUSTNESS_CONFIGS, ROOT,
                              constant_logit_checkpoint, expected_row,
                              make_robustness_sets, write_tiny_configs)

PROBE_DIR = osp.join(ROOT, 'configs', 'linear_probe')
# set suffix -> (dataset type, evaluator type)
SETS = {
    'in-sketch': ('ImageNetSketch', 'Accuracy'),
    'in-a': ('ImageNetA', 'SubsetAccuracy'),
    'in-r': ('ImageNetR', 'SubsetAccuracy'),
    'in-real': ('ImageNet', 'ReaLAccuracy'),
}
# model -> (backbone type, embed dims, registers)
BACKBONES = {
    'dinovim-tiny-p16': ('DinoVim', 256, 0),
    'dinovim-small-p16': ('DinoVim', 512, 0),
    'dinovim-base-p16': ('DinoVim', 768, 0),
    'dinomamba-reg-base-p16': ('DinoVim', 768, 12),
    'linearvit-base-p16': ('LinearViT', 768, 0),
    'vit-base-p16': ('VisionTransformer', 768, 0),
}
CONFIGS = sorted(f'{model}_{suffix}.py' for model in BACKBONES for suffix in SETS)
FRAGMENTS = {'robustness_dataset', 'robustness_evaluator'}


@functools.lru_cache(maxsize=None)
def load(path):
    """The config, parsed once per session (mmpretrain:: bases take seconds)."""
    return Config.fromfile(path)


def robustness_config(name):
    """A copy of a robustness config, free to modify."""
    return copy.deepcopy(load(osp.join(ROBUSTNESS_CONFIGS, name)))


@functools.lru_cache(maxsize=None)
def imagenet_probes():
    """model name -> linear-probe config, for the probes with a 1000-way head
    (the toy probe's 4 classes cannot be scored on ImageNet's test sets)."""
    probes = {}
    for path in sorted(glob.glob(osp.join(PROBE_DIR, '*.py'))):
        if load(path).model.head.num_classes == 1000:
            probes[osp.basename(path).split('_')[0]] = path
    return probes


def split(name):
    model, suffix = name[:-len('.py')].rsplit('_', 1)
    return model, suffix


def test_every_imagenet_probe_has_the_four_configs():
    found = {osp.basename(p) for p in glob.glob(osp.join(ROBUSTNESS_CONFIGS, '*.py'))}
    assert found == set(CONFIGS)
    assert set(imagenet_probes()) == set(BACKBONES) == set(BACKBONE_NAMES)
    assert [s.suffix for s in ROBUSTNESS_SETS] == list(SETS)


@pytest.mark.parametrize('name', CONFIGS)
def test_config_is_its_probe_with_another_test_set(name):
    model, suffix = split(name)
    cfg = robustness_config(name).to_dict()
    probe = load(imagenet_probes()[model]).to_dict()
    assert set(cfg) == set(probe) | FRAGMENTS
    for key in set(probe) - {'test_dataloader', 'test_evaluator'}:
        assert cfg[key] == probe[key], key
    loader, probe_loader = cfg['test_dataloader'], probe['test_dataloader']
    assert {k: v for k, v in loader.items() if k != 'dataset'} == \
        {k: v for k, v in probe_loader.items() if k != 'dataset'}
    assert loader['dataset']['pipeline'] == probe_loader['dataset']['pipeline']
    dataset_type, evaluator_type = SETS[suffix]
    assert loader['dataset']['type'] == dataset_type
    assert not osp.isabs(loader['dataset']['data_root'])
    assert cfg['test_evaluator']['type'] == evaluator_type


@pytest.fixture(scope='module')
def sets(tmp_path_factory):
    return make_robustness_sets(str(tmp_path_factory.mktemp('robustness')))


@pytest.mark.parametrize('name', CONFIGS)
def test_dataset_and_evaluator_build(name, sets):
    _, suffix = split(name)
    cfg = robustness_config(name)
    cfg.test_dataloader.dataset.data_root = sets['roots'][suffix]
    if suffix == 'in-real':
        cfg.test_evaluator.real_file = sets['real_file']
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
        evaluator = Evaluator(cfg.test_evaluator)
    files = sets['files'][suffix]
    size = len(files) if suffix == 'in-real' else sum(map(len, files.values()))
    assert len(dataset) == size
    assert tuple(dataset[0]['inputs'].shape) == (3, 224, 224)
    assert type(evaluator.metrics[0]).__name__ == SETS[suffix][1]
    if suffix in ('in-a', 'in-r'):
        assert dataset.metainfo['imagenet_subset'] == sets['classes'][suffix]


@pytest.mark.parametrize('model', sorted(BACKBONES))
def test_model_builds(model):
    cfg = robustness_config(f'{model}_in-a.py')
    backbone, dims, registers = BACKBONES[model]
    with DefaultScope.overwrite_default_scope('mmpretrain'), torch.device('meta'):
        classifier = MODELS.build(cfg.model)
    assert type(classifier.backbone).__name__ == backbone
    assert classifier.backbone.embed_dims == dims
    assert getattr(classifier.backbone, 'num_registers', 0) == registers
    assert classifier.head.fc.out_features == 1000
    assert classifier.head.fc.in_features == dims * len(cfg.model.backbone.out_indices)


@pytest.mark.slow
def test_tiny_model_through_tools_test(sets, tmp_path):
    config = write_tiny_configs(str(tmp_path / 'configs'), {'in-a': sets['roots']['in-a']},
                                sets['real_file'])['in-a']
    bias = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    bias[300] = 10.0  # the 1000-way top-1, a class ImageNet-A does not have
    bias[512] = 5.0  # the top-1 among ImageNet-A's classes
    ckpt, out = str(tmp_path / 'probe.pth'), str(tmp_path / 'metrics.json')
    constant_logit_checkpoint(config, ckpt, bias)
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run(
        [sys.executable, 'tools/test.py', config, ckpt, '--work-dir',
         str(tmp_path / 'work_dir'), '--out', out],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'subset/top1:' in proc.stdout + proc.stderr
    with open(out) as f:
        metrics = json.load(f)
    assert metrics['subset/images'] == 6
    # restricted, the images of class 512 are right; unrestricted, none would be
    expected = expected_row(sets, bias.tolist())['in-a']
    assert expected > 0 and metrics['subset/top1'] == pytest.approx(expected, abs=1e-9)
