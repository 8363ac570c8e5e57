"""tools/analysis/activation_maps.py on the toy data: PNGs, JSON, consistency."""
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from mmdinomamba.models import DinoVim

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
TOY_CONFIG = osp.join(REPO, 'configs', 'binary_auc', 'binary-auc_dinovim-toy-p8_toy.py')


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/analysis/activation_maps.py')


@pytest.fixture(scope='module')
def toy(tmp_path_factory, toy_data):
    tmp = tmp_path_factory.mktemp('maps_tool')
    root = toy_data(num_classes=3, train_per_class=1, val_per_class=1, size=48,
                    formats=['imagenet'])
    cfg = Config.fromfile(TOY_CONFIG)
    torch.manual_seed(0)
    backbone = DinoVim(**{k: v for k, v in cfg.model.backbone.items() if k != 'type'})
    ckpt = str(tmp / 'backbone.pth')  # a bare backbone, as extract_teacher.py writes
    torch.save(backbone.state_dict(), ckpt)
    options = ['--cfg-options', f'test_dataloader.dataset.data_root={root}']
    return tmp, ckpt, options


def test_tool_writes_readable_pngs_and_consistent_numbers(toy, capsys, tool):
    tmp, ckpt, options = toy
    out = tmp / 'out'
    paths = tool.main([TOY_CONFIG, ckpt, '--images', '2', '0', '1',
                              '--curve-images', '3', '--out-dir', str(out),
                              '--device', 'cpu'] + options)
    # atomic writes leave exactly the three results behind
    assert sorted(os.listdir(out)) == ['activation_maps.png', 'layer_auc.json',
                                       'layer_auc.png']
    with Image.open(paths['grid']) as grid:
        assert grid.format == 'PNG'
        # 3 rows of image, mask, 8 heads and the mean: 11 x 3 tiles of ~125 px
        assert grid.width > 11 * 100 and grid.height > 3 * 100
        pixels = np.asarray(grid.convert('L'), np.float64)
        assert pixels.std() > 20  # not a blank canvas
    with Image.open(paths['curve']) as curve:
        assert curve.format == 'PNG'
    with open(paths['json']) as file:
        data = json.load(file)
    assert data['num_images'] == 3 and data['checkpoint'] == ckpt
    rows = data['layers']
    assert [r['layer'] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert len(row['heads']) == 8 and row['num_skipped'] == 0
        assert all(0 <= a <= 1 for a in row['heads'] + [row['mean_map_auc']])
    # The grid's per-map AUCs (the last block, all 3 images) and the metric's
    # per-layer numbers come from the same maps: the curve's last point is their
    # mean over images (heads, then the head-mean map), up to float rounding.
    aucs = np.array(data['grid']['aucs'])
    assert aucs.shape == (3, 9)
    np.testing.assert_allclose(rows[-1]['heads'], aucs[:, :8].mean(0), atol=1e-9)
    assert rows[-1]['mean_map_auc'] == pytest.approx(aucs[:, 8].mean(), abs=1e-9)
    assert rows[-1]['binary_auc'] == pytest.approx(aucs[:, :8].mean(), abs=1e-9)
    printed = capsys.readouterr().out.splitlines()
    table = printed[printed.index('block  binary_auc  mean_map_auc  skipped') + 1:]
    assert [float(line.split()[1]) for line in table[:4]] == \
        [round(r['binary_auc'], 4) for r in rows]


def test_tool_errors(toy, tmp_path, tool):
    _, ckpt, options = toy
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        tool.main([TOY_CONFIG, str(tmp_path / 'none.pth'), '--out-dir',
                   str(tmp_path)] + options)
    with pytest.raises(ValueError, match='out of range'):
        tool.main([TOY_CONFIG, ckpt, '--images', '7', '--out-dir', str(tmp_path)]
                  + options)
    other = osp.join(REPO, 'configs', 'analysis', 'dinovim-mini_p16_128px.py')
    with pytest.raises(ValueError, match='ActivationMapModel'):
        tool.main([other, '--out-dir', str(tmp_path)])
    assert not any(name.endswith('.png') for name in os.listdir(tmp_path))
