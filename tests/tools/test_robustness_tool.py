"""tools/analysis/robustness.py: all four sets of a tiny probe, the table and the JSON."""
import json

import pytest
import torch

from tests.helpers.robustness_data import (constant_logit_checkpoint, expected_row,
                              make_robustness_sets, write_tiny_configs)


@pytest.mark.slow
def test_runs_the_four_sets_and_prints_the_row(load_tool, tmp_path, capsys):
    tool = load_tool('tools/analysis/robustness.py')
    sets = make_robustness_sets(str(tmp_path / 'data'))
    configs = write_tiny_configs(str(tmp_path / 'configs'), sets['roots'],
                                 sets['real_file'])
    bias = torch.rand(1000, generator=torch.Generator().manual_seed(1))
    bias[7] = 10.0  # the 1000-way top-1: a Sketch class, in some ReaL lists
    bias[512] = 6.0  # top-1 among ImageNet-A's classes
    bias[640] = 5.0  # top-1 among ImageNet-R's classes
    ckpt, out = str(tmp_path / 'probe.pth'), str(tmp_path / 'out' / 'row.json')
    constant_logit_checkpoint(configs['in-a'], ckpt, bias)
    result = tool.main(['tiny', ckpt, '--config-dir', str(tmp_path / 'configs'),
                        '--work-dir', str(tmp_path / 'work'), '--out', out])
    expected = expected_row(sets, bias.tolist())
    # mmpretrain's Accuracy (the Sketch column) computes in float32: the percent is
    # off by up to 100 * 2^-24 ~ 6e-6; our metrics count in Python floats
    assert result['row'] == pytest.approx(
        [expected[s] for s in ('in-sketch', 'in-a', 'in-r', 'in-real')], abs=1e-5)
    excluded = sum(not labels for labels in sets['real'])
    assert result['metrics']['ReaL']['real/excluded'] == excluded
    printed = capsys.readouterr().out
    assert f'ReaL: {excluded} images without labels excluded' in printed
    assert ' '.join(f'{v:.1f}' for v in result['row']) in ' '.join(printed.split())
    with open(out) as f:
        assert json.load(f)['row'] == pytest.approx(result['row'])


def test_unknown_model_names_the_known_ones(load_tool, tmp_path):
    tool = load_tool('tools/analysis/robustness.py')
    ckpt = tmp_path / 'probe.pth'
    ckpt.write_bytes(b'')
    with pytest.raises(FileNotFoundError, match="'dinovim-base-p16'"):
        tool.main(['dinovim-huge-p16', str(ckpt)])


def test_missing_checkpoint(load_tool, tmp_path):
    tool = load_tool('tools/analysis/robustness.py')
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        tool.main(['dinovim-base-p16', str(tmp_path / 'none.pth')])


def test_backbone_names_and_aliases_reach_the_shipped_configs(load_tool, tmp_path,
                                                              monkeypatch):
    """Without --config-dir the shipped configs are used from any folder, and MODEL
    is a zoo name, an alias or the config prefix."""
    tool = load_tool('tools/analysis/robustness.py')
    for name in ('dinovim-base', 'dinovim-b', 'DinoVim-B', 'dinovim-base-p16'):
        assert tool.shipped_config_prefix(name) == 'dinovim-base-p16'
    assert tool.shipped_config_prefix('reg-b') == 'dinomamba-reg-base-p16'
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / 'probe.pth'
    ckpt.write_bytes(b'')
    # the configs are found (from another folder); their data is not: the data
    # check of tools/test.py fails, after the config was read
    with pytest.raises(FileNotFoundError,
                       match="data_root='data/imagenet-a'\\): 'data/imagenet-a' does "
                       'not exist'):
        tool.main(['vit-b', str(ckpt), '--sets', 'IN-A'])


@pytest.fixture(scope='module')
def tiny_sets(tmp_path_factory):
    """The tiny IN-A set, its config and a fitting probe checkpoint's state."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    root = tmp_path_factory.mktemp('robustness')
    sets = make_robustness_sets(str(root / 'data'))
    configs = write_tiny_configs(str(root / 'configs'), sets['roots'],
                                 sets['real_file'])
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        state = MODELS.build(Config.fromfile(configs['in-a']).model).state_dict()
    return root, state


def unfit_checkpoints(folder, state):
    """name -> (path, message) of the files that printed a row with exit 0."""
    import argparse
    backbone = {k[len('backbone.'):]: v for k, v in state.items()
                if k.startswith('backbone.')}
    nan = dict(state)
    nan['head.fc.bias'] = torch.full_like(nan['head.fc.bias'], float('nan'))
    files = {
        'dino': (dict(meta={}, state_dict={
            **{f'backbone.{k}': v for k, v in backbone.items()},
            **{f'teacher.backbone.{k}': v for k, v in backbone.items()},
            'head.last_layer.weight': torch.zeros(4, 4)}),
            'It is a DINO pretraining checkpoint'),
        'official': (dict(teacher={f'module.backbone.{k}': v
                                   for k, v in backbone.items()},
                          args=argparse.Namespace(arch='vim_tiny')),
                     'argparse.Namespace'),
        'nan': (dict(meta={}, state_dict=nan),
                '1 tensors hold NaN or infinite values: head.fc.bias'),
    }
    out = {}
    for name, (checkpoint, message) in files.items():
        out[name] = str(folder / f'{name}.pth'), message
        torch.save(checkpoint, out[name][0])
    return out


@pytest.mark.parametrize('name', ['dino', 'official', 'nan'])
def test_a_checkpoint_that_does_not_fit_prints_no_row(load_tool, tiny_sets, tmp_path,
                                                      capsys, name):
    """A DINO checkpoint, an official file or NaN weights each printed a row
    (25.0 / 12.5 / 0.0) with exit 0; they are refused as tools/test.py refuses
    them, naming the file."""
    tool = load_tool('tools/analysis/robustness.py')
    root, state = tiny_sets
    path, message = unfit_checkpoints(tmp_path, state)[name]
    with pytest.raises(Exception) as info:
        tool.main(['tiny', path, '--sets', 'IN-A', '--config-dir',
                   str(root / 'configs'), '--work-dir', str(tmp_path / 'work')])
    assert path in str(info.value) and message in str(info.value)
    assert 'IN-Sketch' not in capsys.readouterr().out  # the table's header


@pytest.mark.slow
def test_the_tool_exits_non_zero_on_nan_weights(tiny_sets, tmp_path):
    import subprocess
    import sys

    from tests.helpers.toy_training import ENV, ROOT
    root, state = tiny_sets
    path, message = unfit_checkpoints(tmp_path, state)['nan']
    proc = subprocess.run(
        [sys.executable, 'tools/analysis/robustness.py', 'tiny', path, '--sets', 'IN-A',
         '--config-dir', str(root / 'configs'), '--work-dir', str(tmp_path / 'work')],
        env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert message in proc.stderr and 'IN-Sketch' not in proc.stdout
