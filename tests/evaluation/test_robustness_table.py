"""The robustness table: columns, config paths, the row and its formatting."""
import os.path as osp

import pytest

from mmdinomamba.evaluation.robustness import (PAPER_ROBUSTNESS, ROBUSTNESS_SETS,
                                               format_table, robustness_config,
                                               robustness_row)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_DIR = osp.join(ROOT, 'configs', 'robustness')


def metrics(values):
    return [{spec.metric: value, 'other': -1.0} for spec, value in zip(ROBUSTNESS_SETS, values)]


def test_row_reads_each_columns_metric():
    assert robustness_row(metrics([1.0, 2.0, 3.0, 4.0])) == [1.0, 2.0, 3.0, 4.0]
    assert robustness_row([None, *metrics([1.0, 2.0, 3.0, 4.0])[1:]]) == [None, 2.0, 3.0, 4.0]


def test_row_errors():
    with pytest.raises(ValueError, match='expected 4'):
        robustness_row(metrics([1.0]))
    with pytest.raises(ValueError, match='real/top1'):
        robustness_row(metrics([1.0, 2.0, 3.0]) + [{'accuracy/top1': 4.0}])


def test_table_puts_the_paper_row_under_the_measured_one():
    lines = format_table('dinovim-base-p16', [27.61, 14.24, None, 84.3], 3163).splitlines()
    assert lines[0].split() == ['backbone'] + [s.column for s in ROBUSTNESS_SETS]
    assert lines[1].split() == ['DinoVim-B', '27.6', '14.2', '-', '84.3']
    assert lines[2].split() == ['DinoVim-B', '(paper)'] + [
        f'{v:.1f}' for v in PAPER_ROBUSTNESS['dinovim-base-p16']]
    assert lines[3] == 'ReaL: 3163 images without labels excluded'
    assert len({len(line) for line in lines[:3]}) == 1  # aligned columns


def test_table_without_paper_numbers():
    lines = format_table('dinovim-tiny-p16', [1.0, 2.0, 3.0, 4.0]).splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == 'DinoVim-T'


def test_config_paths():
    for spec in ROBUSTNESS_SETS:
        assert osp.isfile(robustness_config(CONFIG_DIR, 'vit-base-p16', spec.suffix))
    with pytest.raises(FileNotFoundError, match="'linearvit-base-p16'"):
        robustness_config(CONFIG_DIR, 'vit-huge-p14', 'in-a')
