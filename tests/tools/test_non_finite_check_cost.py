"""tools/analysis/non_finite_check_cost.py: what it times is the hook's check."""
import re

import pytest
import torch

from mmdinomamba.models import DinoVim


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/analysis/non_finite_check_cost.py')


def test_prints_the_gradient_set_of_each_preset(tool, capsys):
    tool.main(['--arch', 'tiny', '--runs', '1'])
    params = list(DinoVim(arch='tiny').parameters())
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(rf'DinoVim-tiny on cpu: {len(params)} gradient tensors, '
                        rf'{sum(p.numel() for p in params) / 1e6:.1f}M values: '
                        r'[0-9.]+ ms per step', line), line


def test_the_timed_check_sees_a_non_finite_gradient(tool):
    grads = [torch.zeros(3), torch.ones(2, 2)]
    assert tool.check(grads, [torch.tensor(1.0)])
    grads[1][1, 0] = float('-inf')
    assert not tool.check(grads, [torch.tensor(1.0)])
    assert not tool.check([torch.zeros(3)], [torch.tensor(float('nan'))])


def test_runs_must_be_positive(tool):
    with pytest.raises(ValueError, match='--runs must be >= 1, got 0'):
        tool.main(['--arch', 'tiny', '--runs', '0'])
