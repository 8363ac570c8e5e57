"""tools/analysis/mixer_rank.py end to end on toy images, for the three mixers."""
import csv
import json
import os.path as osp

import pytest
from PIL import Image

REPO = osp.join(osp.dirname(__file__), '..', '..')


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/analysis/mixer_rank.py')


@pytest.mark.parametrize('config,kind,keys', [
    ('dinovim-mini_p16_128px.py', 'ssd', {'forward', 'backward', 'combined'}),
    ('linearvit-mini_p16_128px.py', 'linear', {'attention'}),
    ('vit-mini_p16_128px.py', 'softmax', {'attention'}),
])
def test_tool_writes_table_and_plots(tmp_path, capsys, config, kind, keys, tool):
    out = tmp_path / 'rank'
    paths = tool.main([
        osp.join(REPO, 'configs', 'analysis', config), '--toy', '--num-images', '2',
        '--img-size', '64', '--layers', '0', '-1', '--chunk', '8', '--out-dir',
        str(out), '--device', 'cpu', '--no-progress'])
    assert sorted(paths) == ['heads_csv', 'json', 'rank_png', 'spectra_png',
                             'summary_csv', 'table']
    data = json.load(open(paths['json']))
    assert data['meta']['layers'] == [0, 3] and data['meta']['chunk'] == 8
    assert {s['key'] for s in data['summary']} == keys
    assert {s['kind'] for s in data['summary']} == {kind}
    assert all(s['within_bounds'] for s in data['summary'])
    with open(paths['summary_csv']) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * len(keys)
    if kind == 'linear':  # non-causal linear attention: global rank <= D_QK = 16
        assert all(int(r['rank_max']) <= 16 for r in rows)
    else:  # softmax and SSD: full rank for the 16 patches + readout tokens
        assert all(int(r['rank_min']) == int(r['seqlen']) for r in rows)
    for key in ('spectra_png', 'rank_png'):
        with Image.open(paths[key]) as image:
            assert image.format == 'PNG'
    printed = capsys.readouterr().out
    assert open(paths['table']).read().strip() in printed


def test_tool_needs_an_image_source(tmp_path, tool):
    with pytest.raises(SystemExit):
        tool.main([osp.join(REPO, 'configs', 'analysis',
                                   'linearvit-mini_p16_128px.py'),
                          '--out-dir', str(tmp_path)])


def test_tool_refuses_a_checkpoint_that_does_not_cover_the_backbone(tmp_path, tool):
    """A checkpoint with only the embeddings (a ViT's names and shapes) fails
    naming the missing keys; --no-strict runs, keeping the random blocks."""
    import torch
    from mmengine.config import Config

    from mmdinomamba.analysis.loading import load_backbone
    config = osp.join(REPO, 'configs', 'analysis', 'dinovim-mini_p16_128px.py')
    state = load_backbone(Config.fromfile(config)).state_dict()
    path = str(tmp_path / 'embeddings.pth')
    torch.save({k: v for k, v in state.items()
                if not k.startswith(('layers.', 'norm_f'))}, path)
    args = [config, path, '--toy', '--num-images', '1', '--img-size', '32',
            '--layers', '0', '--chunk', '8', '--device', 'cpu', '--no-progress',
            '--out-dir', str(tmp_path / 'out')]
    with pytest.raises(ValueError, match=r'missing keys .*layers\.0\.mixer\.in_proj'):
        tool.main(args)
    assert not (tmp_path / 'out').exists()
    assert 'json' in tool.main(args + ['--no-strict'])


def test_tool_takes_a_dino_config(tmp_path, tool):
    """A DINO config's model is the self-supervised algorithm, with a multi-view
    preprocessor; the tool reads its backbone and normalises images one view each
    (it failed with "'list' object has no attribute 'dim'")."""
    paths = tool.main([
        osp.join(REPO, 'configs', 'dino', 'dino_dinovim-toy-p8_1xb8-10e_toy.py'),
        '--toy', '--num-images', '2', '--layers', '-1', '--chunk', '16', '--out-dir',
        str(tmp_path / 'rank'), '--device', 'cpu', '--no-progress'])
    data = json.load(open(paths['json']))
    assert data['meta']['backbone'] == 'DinoVim' and data['meta']['layers'] == [3]
    assert {s['key'] for s in data['summary']} == {'forward', 'backward', 'combined'}


def test_multi_view_preprocessor_becomes_its_single_image_twin():
    import torch

    from mmdinomamba.analysis.images import single_view_preprocessor
    from mmengine.registry import MODELS, init_default_scope
    init_default_scope('mmpretrain')
    dino = dict(type='SelfSupDataPreprocessor', mean=[1.0, 2.0, 3.0],
                std=[2.0, 4.0, 8.0], to_rgb=True)
    single = MODELS.build(single_view_preprocessor(dino))
    image = torch.randint(0, 255, (3, 4, 4), dtype=torch.uint8)
    out = single(dict(inputs=[image]), False)['inputs']
    expected = (image.flip(0).float() - torch.tensor([1.0, 2.0, 3.0])[:, None, None]) \
        / torch.tensor([2.0, 4.0, 8.0])[:, None, None]  # BGR -> RGB, then normalise
    torch.testing.assert_close(out[0], expected)
    plain = dict(type='ClsDataPreprocessor', mean=[0.0], std=[1.0])
    assert single_view_preprocessor(plain) is plain


def linear_probe_configs():
    import glob
    return sorted(glob.glob(osp.join(REPO, 'configs', 'linear_probe', '*.py')) +
                  glob.glob(osp.join(REPO, 'configs', 'compare', 'linear-probe_*.py')))


def test_every_linear_probe_config_gives_images():
    """A linear-probe config's preprocessor is mmpretrain's top-level
    ``data_preprocessor`` without a ``type`` (the classifier fills it in): the tool
    crashed on every one with ``KeyError: ... must contain the key "type"``. It
    normalises as the config says: RGB, (x - mean) / std."""
    import numpy as np
    import torch
    from mmengine.config import Config

    from mmdinomamba.analysis.images import ImagePipeline
    paths = linear_probe_configs()
    assert len(paths) >= 14
    image = np.random.RandomState(0).randint(0, 256, (80, 80, 3), dtype=np.uint8)
    for path in paths:
        cfg = Config.fromfile(path)
        assert 'type' not in cfg.data_preprocessor, path
        out = ImagePipeline(cfg, 64).preprocessor(
            dict(inputs=[torch.from_numpy(image[..., ::-1].copy()).permute(2, 0, 1)]),
            False)['inputs'][0]
        mean = torch.tensor(cfg.data_preprocessor.mean)[:, None, None]
        std = torch.tensor(cfg.data_preprocessor.std)[:, None, None]
        expected = (torch.from_numpy(image).permute(2, 0, 1).float() - mean) / std
        torch.testing.assert_close(out, expected, msg=path)


def test_tool_takes_a_linear_probe_config_and_its_checkpoint(tmp_path, tool):
    """The toy linear probe, its backbone from a checkpoint (the config's own
    init_cfg names the DINO run's, which this test has not made)."""
    import torch
    from mmengine.config import Config

    from mmdinomamba.analysis.loading import load_backbone
    config = osp.join(REPO, 'configs', 'linear_probe',
                      'dinovim-toy-p8_1xb16-linear-10e_toy.py')
    cfg = Config.fromfile(config)
    cfg.model.backbone.init_cfg = None
    state = load_backbone(cfg).state_dict()
    path = str(tmp_path / 'probe.pth')
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in state.items()}}, path)
    paths = tool.main([config, path, '--toy', '--num-images', '1', '--layers', '-1',
                       '--chunk', '16', '--out-dir', str(tmp_path / 'rank'),
                       '--device', 'cpu', '--no-progress'])
    data = json.load(open(paths['json']))
    assert data['meta']['backbone'] == 'DinoVim' and data['meta']['layers'] == [3]
