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


def test_wrong_shapes_are_refused_strict_or_not_listed_first_with_counts():
    """mmengine skips a tensor of another shape with a log line and loads the
    rest; the hook refuses the file before anything is loaded, --no-strict too,
    and lists the shape mismatches before the missing tensors."""
    state = probe_state()
    state['module.head.weight'] = torch.zeros(2, 4)  # a head of another width
    del state['module.backbone.bias']
    for strict in (True, False):
        with pytest.raises(ValueError) as info:
            load(dict(state_dict=state), strict)
        message = str(info.value)
        assert message.startswith("ckpt.pth does not fit the model: 1 of the model's "
                                  '4 tensors have another shape in it (checkpoint vs '
                                  'model): head.weight: (2, 4) vs (2, 3); and it would '
                                  "leave 1 of the model's 4 tensors uninitialised "
                                  '(not in the checkpoint): backbone.bias.')
        assert 'Nothing was loaded' in message and 'with --no-strict neither' in message


class WithPositions(nn.Module):

    def __init__(self, tokens=5, channels=4):
        super().__init__()
        self.backbone = nn.Module()
        self.backbone.pos_embed = nn.Parameter(torch.zeros(1, tokens, channels))


def test_a_position_table_of_another_grid_is_not_a_mismatch():
    """The backbones resize a pos_embed of another grid on load; one of another
    width is a mismatch."""
    assert load({'backbone.pos_embed': torch.zeros(1, 17, 4)},
                model=WithPositions()) == []
    with pytest.raises(ValueError, match=r'backbone\.pos_embed: \(1, 5, 8\) vs '
                       r'\(1, 5, 4\)'):
        load({'backbone.pos_embed': torch.zeros(1, 5, 8)}, model=WithPositions())


def test_evaluation_refuses_a_backbone_the_checkpoint_does_not_fill():
    """--no-strict on tools/test.py: a checkpoint of the head alone would score a
    random backbone; training (load_from) only warns."""
    state = {k: v for k, v in probe_state().items() if 'head' in k}
    runner = SimpleNamespace(model=Probe(), _load_from='ckpt.pth',
                             logger=MMLogger.get_instance('strict-load-unit'))
    with pytest.raises(ValueError, match=r"ckpt\.pth holds none of the 2 tensors "
                       r"of the model's backbone: refusing to score a randomly "
                       r'initialised backbone, --no-strict or not'):
        StrictLoadHook(strict=False, evaluation=True).after_load_checkpoint(
            runner, dict(state_dict=state))
    assert len(load(dict(state_dict=state), strict=False)) == 1
    partial = dict(state, **{'module.backbone.weight': torch.zeros(3, 2)})
    warnings = []
    runner.logger = SimpleNamespace(warning=warnings.append)
    StrictLoadHook(strict=False, evaluation=True).after_load_checkpoint(
        runner, dict(state_dict=partial))
    assert len(warnings) == 1 and 'backbone.bias' in warnings[0]


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
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
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
    # the DINO run of the same family at another width (32 instead of 64)
    narrow = Config.fromfile(TOY_CONFIG).model
    narrow.backbone.arch.embed_dims = 32
    narrow.head.in_channels = 32
    narrow = MODELS.build(narrow).state_dict()
    three = Config.fromfile(config).model
    three.head.num_classes = 3  # a probe head of another shape
    three = MODELS.build(three).state_dict()
    paths = dict(config=config, probe_state=probe, narrow_state=narrow)
    for name, checkpoint in (
            ('narrow_dino', dict(meta={}, state_dict=narrow)),
            ('three_classes', dict(meta={}, state_dict=three)),
            ('head_only', dict(meta={}, state_dict={
                k: v for k, v in probe.items() if k.startswith('head.')})),
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


@pytest.mark.slow
@pytest.mark.parametrize('strict', [[], ['--no-strict']])
def test_test_tool_refuses_another_width_listing_shape_mismatches_first(files, strict):
    """A DINO checkpoint of the same family at another width: mmengine named 2
    missing head tensors, hid the shape mismatches and suggested --no-strict,
    which then scored a random backbone with exit 0. Now the mismatches come
    first, counted, and --no-strict does not load past them."""
    own, narrow = files['probe_state'], files['narrow_state']
    mismatched = [k for k, v in own.items() if k in narrow and narrow[k].shape != v.shape]
    missing = [k for k in own if k not in narrow]
    assert missing == ['head.fc.weight', 'head.fc.bias'] and len(mismatched) > 10
    code, output = run_test(files, 'narrow_dino', *strict)
    assert code != 0, output[-3000:]
    expected = (f"{files['narrow_dino']} does not fit the model: {len(mismatched)} of "
                f"the model's {len(own)} tensors have another shape in it")
    assert expected in output, output[-3000:]
    assert output.index(expected) < output.index("and it would leave 2 of the model's")
    assert 'Nothing was loaded' in output and 'accuracy/top1' not in output


@pytest.mark.slow
def test_test_tool_refuses_a_head_of_another_shape(files):
    """A probe of 3 classes on the 2-class config: scored 18.75 % with exit 0."""
    code, output = run_test(files, 'three_classes', '--no-strict')
    assert code != 0, output[-3000:]
    assert 'head.fc.weight: (3, 128) vs (2, 128)' in output
    assert 'head.fc.bias: (3,) vs (2,)' in output and 'accuracy/top1' not in output


@pytest.mark.slow
def test_test_tool_refuses_to_score_a_backbone_the_checkpoint_does_not_fill(files):
    code, output = run_test(files, 'head_only', '--no-strict')
    assert code != 0, output[-3000:]
    assert 'refusing to score a randomly initialised backbone' in output
    assert 'accuracy/top1' not in output


def run_train(files, tmp_path, *args):
    work_dir = tmp_path / 'work'
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools/train.py'), files['config'],
         '--work-dir', str(work_dir), '--cfg-options', 'train_cfg.max_epochs=1',
         'model.backbone.init_cfg=None', *args],
        env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, work_dir


@pytest.mark.slow
@pytest.mark.parametrize('how', ['load_from', 'resume'])
def test_train_tool_refuses_wrong_shapes_before_training(files, tmp_path, how):
    """load_from and --resume kept training past the size mismatches."""
    path = files['three_classes']
    args = ['--resume', path] if how == 'resume' else [f'load_from={path}']
    if how == 'load_from':  # one more --cfg-options value
        code, output, work_dir = run_train(files, tmp_path, *args, '--no-strict')
    else:
        code, output, work_dir = run_train(files, tmp_path, *args)
    assert code != 0, output[-3000:]
    assert f"{path} does not fit the model: 2 of the model's" in output, output[-3000:]
    assert 'head.fc.weight: (3, 128) vs (2, 128)' in output
    assert not list(work_dir.glob('*.pth')) and 'Epoch(train)' not in output
