"""MLLA inside the analysis: its mixing matrices reproduce the mixer, the rank tool
measures the bounds of docs/mlla.md on the official reference model's weights, and activation
maps and the comparison engine take the hierarchical backbone."""
import copy
import json
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.analysis import (analyse_backbone, layer_activation_maps,
                                  mixing_matrices, mixing_values)
from mmdinomamba.studies.comparison.measures import (load_split, measure_backbone,
                                             rank_by_layer)
from mmdinomamba.analysis.mixing import capture_mixer_calls, mixer_info
from mmdinomamba.analysis.mixing_rank import near_far_ranks, offdiag_bounds
from mmdinomamba.datasets import make_toy_dataset
from mmdinomamba.models import MLLA
from mmdinomamba.models.backbones.mlla_official import convert
from mmdinomamba.models.mixers import MixerInfo
from tests.factories import MLLA_SMALL, mlla_arch
from tests.helpers.reference_data import MLLA as MLLA_REFERENCE
from tests.helpers.reference_data import load_reference

SMALL = MLLA_SMALL  # the official fixture's
TINY = mlla_arch(num_heads=[2, 2, 4, 8])


@pytest.fixture(scope='module')
def official():
    data = load_reference(MLLA_REFERENCE)
    model = MLLA(arch=SMALL, drop_path_rate=0.0)
    model.load_state_dict({k[len('backbone.'):]: v for k, v in
                           convert(data['state_dict']).items()
                           if k.startswith('backbone.')})
    return data, model.eval()


def test_m_x_reproduces_the_official_attention_module(official):
    """On the fixture's weights and attention input (float64): the whole matrix
    times each channel's values, plus the LePE bias, is the attention module's
    output, to 1e-6 (and the official float32 output to 1e-4)."""
    data, model = official
    case = data['cases'][0]
    for k in (0, 1, 3):  # layers.0.blocks.0, layers.1.blocks.0, layers.2.blocks.1
        name = 'layers.{}.blocks.{}'.format(*model.block_index[k])
        mixer = copy.deepcopy(model.token_mixer(k)).double()
        u = case['attn_inputs'][name].double()
        side = int(u.shape[1] ** 0.5)
        hw = (side, side)
        mats = mixing_matrices(mixer, u, torch.float64, hw)
        vals = mixing_values(mixer, u, torch.float64, hw)
        y = (mats['whole'] @ vals['whole'])[..., 0].transpose(1, 2) + \
            mixer.lepe.bias
        with torch.no_grad():
            out = mixer(u, hw)
        torch.testing.assert_close(y, out, rtol=0, atol=1e-6 * out.abs().max().item())
        ref = case['attn_outputs'][name].double()
        assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-4


def test_rank_tool_measures_the_bounds_on_the_fixture(official):
    """docs/mlla.md (MLLA in the Y = M X framework): attention part rank d, whole
    matrix full rank, blocks next to the diagonal d + W, farther blocks d (c = 32,
    64 px)."""
    data, model = official
    report = analyse_backbone(model, data['cases'][0]['input'][:1], layers=[0, 1],
                              chunk=32, progress=False)
    rows = {(s['layer'], s['key']): s for s in report.summary}
    # stage 0: 16 x 16 tokens, d = 4; stage 1: 8 x 8 tokens, d = 8
    for layer, n, d, w in ((0, 256, 4, 16), (1, 64, 8, 8)):
        attn, whole = rows[(layer, 'attention')], rows[(layer, 'whole')]
        assert attn['kind'] == whole['kind'] == 'mlla'
        assert (attn['rank_min'], attn['rank_max'], attn['global_bound']) == (d, d, d)
        assert (whole['rank_min'], whole['rank_max'], whole['seqlen']) == (n, n, n)
        assert whole['near_offdiag_rank_max'] == d + w
        assert whole['near_offdiag_bound'] == d + min(32, w + 1)
        assert whole['grid_width'] == w and whole['nheads'] == 12 * 2 ** layer
        assert attn['within_bounds'] and whole['within_bounds']
    assert rows[(0, 'whole')]['far_offdiag_rank_max'] == 4
    assert rows[(0, 'whole')]['far_offdiag_bound'] == 4
    assert rows[(1, 'whole')]['far_offdiag_rank_max'] is None  # two chunks only
    records = [r for r in report.records if r['layer'] == 0 and r['key'] == 'whole']
    assert len(records) == 12  # one per channel
    assert report.meta['seqlen'] == [64, 256]


def test_mlla_bounds_and_near_far_blocks():
    info = MixerInfo('mlla', 3, 4, ('attention', 'whole'), grid=True, local_kernel=3)
    assert offdiag_bounds(info, 32, 256, key='whole', width=16) == dict(
        global_bound=256, offdiag_bound_paper=21, offdiag_bound_algebra=21,
        near_offdiag_bound=21, far_offdiag_bound=4)
    assert offdiag_bounds(info, 32, 256, key='attention', width=16) == dict(
        global_bound=4, offdiag_bound_paper=4, offdiag_bound_algebra=4,
        near_offdiag_bound=4, far_offdiag_bound=4)
    causal = MixerInfo('mlla', 3, 4, ('attention', ), grid=True, causal=True)
    assert offdiag_bounds(causal, 32, 256)['global_bound'] == 256
    with pytest.raises(ValueError, match='grid width'):
        offdiag_bounds(info, 32, 256, key='whole')
    # 4 chunks of 8: reach 9 makes |I - J| = 1 and 2 near ((2 - 1) * 8 + 1 = 9)
    blocks = torch.arange(16).reshape(4, 4)
    near, far = near_far_ranks(blocks, 8, 9)
    gap = (torch.arange(4)[:, None] - torch.arange(4)).abs()
    assert near == blocks[(gap == 1) | (gap == 2)].max()
    assert far == blocks[gap == 3].max()
    assert near_far_ranks(blocks, 8, 0)[0] is None


def test_grid_mixers_need_the_grid(official):
    _, model = official
    with pytest.raises(ValueError, match='pass hw='):
        mixing_matrices(model.token_mixer(0), torch.randn(1, 16, 12))


def test_capture_gives_each_stage_its_grid():
    torch.manual_seed(0)
    model = MLLA(arch=TINY).eval()
    calls = capture_mixer_calls(model, torch.randn(1, 3, 64, 96), [0, 2, 3])
    assert [calls[i].hw for i in (0, 2, 3)] == [(16, 24), (4, 6), (2, 3)]
    assert calls[2].u.shape == (1, 24, 64)


def test_mixer_rank_tool_on_the_hierarchical_backbone(tmp_path, load_tool):
    tool = load_tool('tools/analysis/mixer_rank.py')
    config = tmp_path / 'mlla.py'
    config.write_text(f'model = dict(type="MLLA", arch={TINY!r}, img_size=64)\n')
    out = str(tmp_path / 'rank')
    tool.main([str(config), '--toy', '--num-images', '1', '--chunk', '16',
               '--layers', '0', '-1', '--out-dir', out, '--no-progress',
               '--device', 'cpu'])
    with open(osp.join(out, 'mixer_rank.json')) as f:
        report = json.load(f)
    keys = [(s['layer'], s['key'], s['seqlen']) for s in report['summary']]
    assert keys == [(0, 'attention', 256), (0, 'whole', 256), (3, 'attention', 4),
                    (3, 'whole', 4)]
    assert all(s['within_bounds'] for s in report['summary'])
    with open(osp.join(out, 'mixer_rank.md')) as f:
        table = f.read()
    assert '| 0 | whole | 16 | 256 |' in table
    for name in ('spectra.png', 'rank_vs_layer.png', 'mixer_rank.csv'):
        assert osp.getsize(osp.join(out, name)) > 0


def test_activation_maps_per_stage_grid():
    torch.manual_seed(0)
    model = MLLA(arch=TINY).eval()
    images = torch.randn(2, 3, 64, 96)
    cosine = layer_activation_maps(model, images, [0, 3], upsample=False)
    assert cosine[0].heads.shape == (2, 2, 16, 24)
    assert cosine[3].heads.shape == (2, 8, 2, 3)
    # independent route: the block's output tokens, readout = their mean
    out = {}
    hook = model.layers[0].blocks[0].register_forward_hook(
        lambda m, a, o: out.__setitem__('t', o))
    with torch.no_grad():
        model(images)
    hook.remove()
    t = out['t']
    r = F.normalize(t.mean(1).reshape(2, 2, 8), dim=-1)
    p = F.normalize(t.reshape(2, 16 * 24, 2, 8), dim=-1)
    expected = torch.einsum('bgc,bngc->bgn', r, p).reshape(2, 2, 16, 24)
    torch.testing.assert_close(cosine[0].heads, expected)
    attention = layer_activation_maps(model, images, [1], method='attention')
    assert attention[1].heads.shape == (2, 2, 64, 96)
    # the mean row of each head's attention part, on stage 1's 8 x 12 grid
    call = capture_mixer_calls(model, images, [1])[1]
    A = mixing_matrices(model.token_mixer(1), call.u, torch.float32,
                        call.hw)['attention']
    row = A.mean(2).reshape(2, 2, 8, 12)
    torch.testing.assert_close(
        attention[1].heads, F.interpolate(row, size=(64, 96), mode='bilinear',
                                          align_corners=False))


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('toy') / 'toy')
    make_toy_dataset(root, num_classes=2, train_per_class=2, val_per_class=3,
                     size=64, formats=['imagenet'], style='rich')
    return root


@pytest.fixture(scope='module')
def toy_val(toy_root):
    return load_split(toy_root, 'meta/val.txt', 'val', 64, 'masks/val')


def test_comparison_measures_mlla(toy_val):
    """measure_backbone (readouts, attention-map AUCs against sklearn) and
    rank_by_layer (the whole matrix, against torch.linalg.matrix_rank)."""
    sklearn_metrics = pytest.importorskip('sklearn.metrics')
    torch.manual_seed(0)
    model = MLLA(arch=TINY).eval()
    m = measure_backbone(model, toy_val, [0, -1], batch_size=4,
                         map_methods=('attention', 'cosine'))
    last = model.num_layers - 1
    with torch.no_grad():
        tokens = model.forward_intermediates(toy_val.images, [last]).features[last]
    torch.testing.assert_close(m.readouts[last], tokens.mean(1))
    maps = layer_activation_maps(model, toy_val.images, [last], method='attention')
    heads = torch.cat([maps[last].heads, maps[last].mean[:, None]], 1)
    for b in range(len(toy_val)):
        fg = (toy_val.label_maps[b] > 0).reshape(-1).numpy()
        for j in range(heads.shape[1]):
            expected = sklearn_metrics.roc_auc_score(fg, heads[b, j].reshape(-1).numpy())
            assert m.aucs['attention'][last][b, j] == pytest.approx(expected, abs=2e-3)
    rows = rank_by_layer(model, toy_val.images[:1], chunk=16)
    assert [r['key'] for r in rows] == ['whole'] * model.num_layers
    for row in rows:
        call = capture_mixer_calls(model, toy_val.images[:1], [row['layer']])[
            row['layer']]
        mixer = copy.deepcopy(model.token_mixer(row['layer'])).double()
        M = mixing_matrices(mixer, call.u, torch.float64, call.hw)['whole'][0]
        expected = torch.linalg.matrix_rank(M).double().mean().item()
        assert row['rank'][0] == pytest.approx(expected)
        assert row['kind'] == 'mlla'
    assert mixer_info(model.token_mixer(0)).keys == ('attention', 'whole')
    assert np.isfinite(m.aucs['cosine'][0]).all()


def test_compare_mixers_takes_mlla(toy_root, tmp_path, load_tool):
    """compare_mixers.py with MLLA beside LinearViT: MLLA's maps, k-NN and ranks
    (of its whole matrix) reach the report."""
    tool = load_tool('tools/analysis/compare_mixers.py')
    configs = {}
    for name, backbone in (
            ('mlla', dict(type='MLLA', arch=TINY, img_size=64)),
            ('lin', dict(type='LinearViT', arch=dict(embed_dims=32, num_layers=2,
                                                     num_heads=4, mlp_ratio=2),
                         img_size=64, patch_size=8))):
        configs[name] = str(tmp_path / f'{name}.py')
        with open(configs[name], 'w') as f:
            f.write(f'model = dict(type="Wrapper", backbone={backbone!r})\n')
    out = str(tmp_path / 'report')
    tool.main(['--out-dir', out, '--data-root', toy_root, '--img-size', '64',
               '--model', 'mlla', configs['mlla'], 'random',
               '--model', 'lin', configs['lin'], 'random', '--pair', 'mlla', 'lin',
               '--rank-images', '1', '--chunk', '16', '--num-resamples', '20',
               '--no-progress'])
    with open(osp.join(out, 'report.json')) as f:
        report = json.load(f)
    mlla = report['models'][0]
    assert (mlla['name'], mlla['kind'], mlla['depth']) == ('mlla', 'mlla', 4)
    assert [r['key'] for r in mlla['ranks']] == ['whole'] * 4
    assert mlla['ranks'][0]['rank'] == [256.0]  # 16 x 16 tokens, full rank
    assert len(mlla['auc_by_method']['attention']) == 4
    with open(osp.join(out, 'report.md')) as f:
        assert '| mlla | mlla |' in f.read()


def test_activation_map_model_takes_mlla():
    from mmdinomamba.analysis import ActivationMapModel
    torch.manual_seed(0)
    model = ActivationMapModel(MLLA(arch=TINY), layer=-1, method='attention').eval()
    maps = model(torch.randn(2, 3, 64, 64), mode='tensor')
    assert maps.shape == (2, 8, 64, 64) and torch.isfinite(maps).all()
