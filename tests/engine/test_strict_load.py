"""Evaluation refuses what does not fit (StrictLoadHook, tools/test.py --no-strict).

mmengine loads ``load_from`` / the test checkpoint with strict=False: a DINO
checkpoint on the linear-probe config evaluated a random head (25 % on 4 classes),
an official-format file an entirely random model, a NaN checkpoint gave 0 %; all
exited 0.
"""
import argparse
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import MMLogger

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.engine import StrictLoadHook

from tests.helpers.toy_training import ENV, ROOT, TOY_CONFIG

PROBE = osp.join(ROOT, 'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py')
CONVERTER = 'tools/model_converters/dinomamba2mmdinomamba.py'


# -- the hook ------------------------------------------------------------------------------

class Probe(nn.Module):

    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(2, 3)
        self.head = nn.Linear(3, 2)


def load(checkpoint, strict=True, model=None):
    logger = MMLogger.get_instance('strict-load-unit', log_level='CRITICAL')
    warnings = []
    logger.warning = warnings.append
    runner = SimpleNamespace(model=model or Probe(), _load_from='ckpt.pth',
                             logger=logger)
    StrictLoadHook(strict).after_load_checkpoint(runner, checkpoint)
    return warnings


def probe_state():
    return {f'module.{k}': v for k, v in Probe().state_dict().items()}  # DDP-saved


def test_a_complete_finite_checkpoint_loads():
    assert load(dict(state_dict=probe_state())) == []


def test_missing_tensors_are_named_and_refused_unless_not_strict():
    state = {k: v for k, v in probe_state().items() if 'head' not in k}
    with pytest.raises(ValueError, match=r"ckpt\.pth leaves 2 of the model's 4 tensors "
                       r'uninitialised \(not in the checkpoint\): head\.weight, '
                       r'head\.bias\..*pass --no-strict'):
        load(dict(state_dict=state))
    warnings = load(dict(state_dict=state), strict=False)
    assert len(warnings) == 1 and 'head.weight, head.bias' in warnings[0]


def test_non_finite_tensors_are_refused_even_when_not_strict():
    state = probe_state()
    state['module.head.bias'] = torch.tensor([0.0, float('nan')])
    for strict in (True, False):
        with pytest.raises(ValueError, match=r'ckpt\.pth: 1 tensors hold NaN or '
                           r'infinite values: head\.bias'):
            load(dict(state_dict=state), strict)


@pytest.mark.parametrize('keys, hint', [
    (['layers.0.mixer.A_log_b', 'norm_f.weight'],
     f'official Dino-Mamba layout \\(layers\\.0\\.mixer\\.A_log_b\\): convert it '
     f'first,\n    python {CONVERTER} ckpt\\.pth OUT\\.pth'),
    (['backbone.weight', 'teacher.backbone.weight', 'teacher.head.weight'],
     r'a DINO pretraining checkpoint \(teacher\.backbone\.\* keys\)'),
])
def test_what_the_checkpoint_is_is_named(keys, hint):
    with pytest.raises(ValueError, match=hint):
        load({k: torch.zeros(1) for k in keys})


# -- tools/test.py -------------------------------------------------------------------------

@pytest.fixture(scope='module')
def files(toy_root, tmp_path_factory):
    """The probe config on the toy data and checkpoints that do not fit it."""
    from mmengine.registry import MODELS, init_default_scope
    init_default_scope('mmpretrain')
    folder = tmp_path_factory.mktemp('strict')
    cfg = Config.fromfile(PROBE)
    cfg.model.head.num_classes = cfg.data_preprocessor.num_classes = 2
    for loader in ('val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=toy_root,
                                   classes=osp.join(toy_root, 'classes.txt'))
        cfg[loader].num_workers = 0
    config = str(folder / 'probe.py')
    cfg.dump(config)
    torch.manual_seed(0)
    probe = MODELS.build(cfg.model).state_dict()
    dino = MODELS.build(Config.fromfile(TOY_CONFIG).model).state_dict()
    backbone = {k[len('backbone.'):]: v for k, v in dino.items()
                if k.startswith('backbone.')}
    official = {f'module.backbone.{k}': v for k, v in backbone.items()}
    nan = dict(probe)
    nan['head.fc.weight'] = torch.full_like(nan['head.fc.weight'], float('nan'))
    paths = dict(config=config)
    for name, checkpoint in (
            ('probe', dict(meta={}, state_dict=probe)),
            ('dino', dict(meta={}, state_dict=dino)),
            ('official_backbone', backbone),
            ('official_dino', dict(teacher=official, student=official, epoch=100,
                                   args=argparse.Namespace(arch='vim_tiny'))),
            ('nan', dict(meta={}, state_dict=nan))):
        paths[name] = str(folder / f'{name}.pth')
        torch.save(checkpoint, paths[name])
    return paths


def run_test(files, name, *args):
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools/test.py'), files['config'], files[name],
         '--work-dir', osp.join(osp.dirname(files[name]), f'work-{name}'), *args],
        env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_test_tool_evaluates_a_probe_checkpoint(files):
    code, output = run_test(files, 'probe')
    assert code == 0, output[-3000:]
    assert 'accuracy/top1' in output


@pytest.mark.parametrize('name, messages', [
    ('dino', ['leaves 2 of the model', 'head.fc.weight, head.fc.bias',
              'It is a DINO pretraining checkpoint', 'pass --no-strict']),
    ('official_backbone', ['leaves', 'official Dino-Mamba layout', 'convert it first',
                           f'python {CONVERTER}']),
    ('official_dino', ['refusing to load', 'argparse.Namespace', 'convert it first:',
                       f'python {CONVERTER}']),
    ('nan', ['tensors hold NaN or infinite values: head.fc.weight']),
])
@pytest.mark.slow
def test_test_tool_refuses_what_does_not_fit(files, name, messages):
    code, output = run_test(files, name)
    assert code != 0, output[-3000:]
    assert files[name] in output
    for message in messages:
        assert message in output, (message, output[-3000:])
    assert 'accuracy/top1' not in output


@pytest.mark.slow
def test_no_strict_evaluates_a_partial_checkpoint_with_a_warning(files):
    code, output = run_test(files, 'dino', '--no-strict')
    assert code == 0, output[-3000:]
    assert 'Loaded anyway (--no-strict)' in output and 'accuracy/top1' in output
