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
    # the configs are found (from another folder); their data is not: the set's
    # dataset fails, after the config was read
    with pytest.raises(FileNotFoundError,
                       match="image folder not found: 'data/imagenet-a"):
        tool.main(['vit-b', str(ckpt), '--sets', 'IN-A'])
