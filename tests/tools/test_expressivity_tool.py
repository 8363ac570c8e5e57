"""tools/analysis/expressivity.py end to end on a tiny sweep, with the attention of
a (random) mmpretrain ViT checkpoint as the trained target."""
import json
import os.path as osp

import pytest
import torch
from PIL import Image

REPO = osp.join(osp.dirname(__file__), '..', '..')
VIT = osp.join(REPO, 'configs', 'analysis', 'vit-mini_p16_128px.py')


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/analysis/expressivity.py')


@pytest.fixture
def checkpoint(tmp_path):
    from mmengine.config import Config

    from mmdinomamba.analysis.loading import load_backbone
    torch.manual_seed(0)
    path = str(tmp_path / 'vit.pth')
    torch.save(load_backbone(Config.fromfile(VIT)).state_dict(), path)
    return path


@pytest.mark.slow  # the tool's sweep fits every family by gradient descent
def test_tool_writes_the_report(tmp_path, tool, checkpoint, capsys):
    from mmengine.config import Config

    from mmdinomamba.studies.expressivity.targets import trained_attention
    from mmdinomamba.analysis.loading import load_backbone
    out = tmp_path / 'report'
    paths = tool.main([
        '--out-dir', str(out), '--families', 'softmax', 'linear',
        '--grid', 'permutation,trained_attention', '16,32', '4', '1',
        '--grid', 'permutation', '16', '2,4', '1', '--budget', '16', '5', '2',
        '--budget', '32', '3', '1', '--feature-dim', '24', '--inputs', 'random,positional',
        '--show-seqlen', '16', '--attention-config', VIT, '--attention-checkpoint',
        checkpoint, '--attention-layer', '1', '--attention-head', '2', '--no-progress'])
    assert sorted(paths) == ['error_vs_seqlen.png', 'error_vs_width.png',
                             'matrices.png', 'report.json', 'report.md']
    for name, path in paths.items():
        if name.endswith('.png'):
            with Image.open(path) as image:
                assert image.format == 'PNG'
    data = json.load(open(paths['report.json']))
    assert data['meta']['trained_attention']['head'] == 2
    assert not osp.isabs(data['meta']['trained_attention']['checkpoint'])
    assert len(data['fits']) == 2 * 2 * (2 * 2 + 1)
    assert {f['inputs'] for f in data['fits']} == {'random', 'positional'}
    # the trained target's floors are those of the model's own attention
    cfg = Config.fromfile(VIT)
    T = trained_attention(load_backbone(cfg, checkpoint), cfg, 32, layer=1, head=2)
    from mmdinomamba.studies.expressivity.targets import rank_floors
    fit = next(f for f in data['fits'] if f['target'] == 'trained_attention' and
               f['seqlen'] == 32 and f['family'] == 'linear' and
               f['inputs'] == 'random')
    assert fit['floor'] == pytest.approx(rank_floors(T, [4])[4], abs=1e-12)
    assert 'report:' in capsys.readouterr().out


def test_trained_attention_is_the_heads_matrix_among_the_patches(checkpoint):
    """Against the rank tool's matrices of the same block on the same image: the
    patch rows and columns, and each row's remainder is the [CLS] column."""
    from mmengine.config import Config

    from mmdinomamba.studies.expressivity.targets import (normalise_image,
                                                           trained_attention,
                                                           trained_attention_image)
    from mmdinomamba.analysis.loading import load_backbone
    from mmdinomamba.analysis.mixing import capture_mixer_inputs, mixing_matrices
    cfg = Config.fromfile(VIT)
    backbone = load_backbone(cfg, checkpoint)
    image = trained_attention_image(32, 16)
    assert image.shape == (4 * 16, 8 * 16, 3)
    T = trained_attention(backbone, cfg, 32, layer=-1, head=1)
    u = capture_mixer_inputs(backbone, normalise_image(image, cfg), [3])[3]
    M = mixing_matrices(backbone.layers[3].attn, u)['attention'][0, 1]
    assert M.shape == (33, 33)  # [CLS] + 4 x 8 patches
    torch.testing.assert_close(T, M[1:, 1:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(T.sum(1) + M[1:, 0], torch.ones(32, dtype=torch.float64),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match='head 4 is out of range'):
        trained_attention(backbone, cfg, 16, head=4)


@pytest.mark.parametrize('extra,message', [
    (['--grid', 'spiral', '16', '4', '1'], "unknown target 'spiral'"),
    (['--grid', 'trained_attention', '16', '4', '1'], 'needs --attention-config'),
    (['--grid', 'permutation', '16', '4', '1', '--families', 'rwkv'],
     'unknown mixer family'),
    (['--grid', 'permutation', '300000', '4', '1'], 'GiB'),
    (['--grid', 'permutation', '16', '4', '1', '--device', 'cuda:99'],
     "device 'cuda:99' is not available"),
])
def test_tool_refuses_bad_sweeps_before_any_work(tmp_path, tool, extra, message,
                                                capsys):
    out = tmp_path / 'report'
    with pytest.raises(SystemExit) as err:
        tool.main(['--out-dir', str(out), '--attention-checkpoint',
                   str(tmp_path / 'missing.pth')] + extra)
    assert message in str(err.value)
    assert not out.exists()


def test_trained_attention_of_a_grid_mixer():
    """A PlainMLLA (grid mixer: RoPE and LePE need the grid) gives its block's
    'attention' matrix of the head, computed on the block's grid, all tokens
    patches (no [CLS])."""
    from mmengine.config import Config

    from mmdinomamba.studies.expressivity.targets import (normalise_image,
                                                           trained_attention,
                                                           trained_attention_image)
    from mmdinomamba.analysis.loading import load_backbone
    from mmdinomamba.analysis.mixing import capture_mixer_inputs, mixing_matrices
    cfg = Config(dict(model=dict(backbone=dict(
        type='PlainMLLA', arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                    mlp_ratio=2), img_size=32, patch_size=8))))
    torch.manual_seed(0)
    backbone = load_backbone(cfg)
    T = trained_attention(backbone, cfg, 24, layer=1, head=1)
    assert T.shape == (24, 24)
    u = capture_mixer_inputs(backbone, normalise_image(trained_attention_image(24, 8),
                                                       cfg), [1])[1]
    M = mixing_matrices(backbone.token_mixer(1), u, hw=(4, 6))['attention'][0, 1]
    torch.testing.assert_close(T, M, rtol=1e-12, atol=1e-12)
