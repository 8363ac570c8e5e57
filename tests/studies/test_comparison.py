"""The comparison engine, each measure against an independent computation."""
import copy
import json
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.analysis.adapters import as_backbone
from mmdinomamba.studies.comparison.measures import (ModelSpec, compare_models, knn_hits,
                                             load_model, load_split,
                                             measure_backbone, paired_gain,
                                             paired_gains, rank_by_layer)
from mmdinomamba.analysis.mixing import (capture_mixer_inputs, mixer_info,
                                         mixing_matrices)
from mmdinomamba.datasets import make_toy_dataset

SIZE = 32
MODELS = {
    'dinovim': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2),
                    img_size=SIZE, patch_size=8,
                    mixer_cfg=dict(d_state=8, headdim=8, ssd_backend='quadratic')),
    'linearvit': dict(type='LinearViT', arch=dict(embed_dims=32, num_layers=2,
                                                  num_heads=4, mlp_ratio=2),
                      img_size=SIZE, patch_size=8),
}


def write_config(folder, name, backbone):
    path = osp.join(folder, f'{name}.py')
    with open(path, 'w') as f:
        f.write(f'model = dict(type="Wrapper", backbone={backbone!r})\n')
    return path


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('cmp') / 'toy')
    make_toy_dataset(root, num_classes=3, train_per_class=8, val_per_class=4,
                     size=SIZE, formats=['imagenet'], style='rich')
    train = load_split(root, 'meta/train.txt', 'train', SIZE)
    val = load_split(root, 'meta/val.txt', 'val', SIZE, 'masks/val')
    return root, train, val


@pytest.fixture(scope='module')
def configs(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp('configs'))
    return {name: write_config(folder, name, cfg) for name, cfg in MODELS.items()}


def test_load_split_reads_images_labels_and_masks(data):
    root, train, val = data
    assert train.images.shape == (24, 3, SIZE, SIZE) and val.label_maps is not None
    assert train.labels.tolist() == [k for k in range(3) for _ in range(8)]
    assert val.label_maps.shape == (12, SIZE, SIZE)
    # the main object is of the image's class and the largest labelled region
    for labels, image_class in zip(val.label_maps, val.labels):
        ids, counts = labels[labels > 0].unique(return_counts=True)
        assert int(ids[counts.argmax()]) == int(image_class) + 1
    # a limit keeps lines spread over the class-sorted list: every class
    some = load_split(root, 'meta/train.txt', 'train', SIZE, limit=6)
    assert some.paths == [train.paths[i] for i in (0, 4, 8, 12, 16, 20)]
    assert some.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(some.images, train.images[::4])
    assert len(load_split(root, 'meta/train.txt', 'train', SIZE, limit=99)) == 24
    with pytest.raises(ValueError, match='limit must be a positive int'):
        load_split(root, 'meta/train.txt', 'train', SIZE, limit=0)


@pytest.mark.parametrize('name', sorted(MODELS))
def test_features_and_auc_match_forward_and_sklearn(data, configs, name):
    sklearn_metrics = pytest.importorskip('sklearn.metrics')
    _, _, val = data
    backbone = load_model(ModelSpec(name, configs[name]))
    m = measure_backbone(backbone, val, batch_size=5)
    last = as_backbone(backbone).num_layers - 1
    # independent route: the backbone's own outputs (readout and patch grid)
    with torch.no_grad():
        backbone.out_type = 'cls_token'
        readout = backbone(val.images)[0]
        backbone.out_type = 'featmap'
        grid = backbone(val.images)[0]  # (batch, dim, h, w)
    torch.testing.assert_close(m.readouts[last], readout, rtol=1e-5, atol=1e-5)
    heads = mixer_info(as_backbone(backbone).token_mixer(last)).nheads
    batch, dim, h, w = grid.shape
    r = F.normalize(readout.reshape(batch, heads, dim // heads, 1, 1), dim=2)
    p = F.normalize(grid.reshape(batch, heads, dim // heads, h, w), dim=2)
    maps = F.interpolate((r * p).sum(2), size=(SIZE, SIZE), mode='bilinear',
                         align_corners=False)
    maps = torch.cat([maps, maps.mean(1, keepdim=True)], 1)
    for b in range(batch):
        fg = (val.label_maps[b] > 0).reshape(-1).numpy()
        for j in range(heads + 1):
            expected = sklearn_metrics.roc_auc_score(fg, maps[b, j].reshape(-1).numpy())
            # float32 maps computed in two orders: ties may split differently
            assert m.aucs['cosine'][last][b, j] == pytest.approx(expected, abs=2e-3)
    assert m.aucs['cosine'][last].shape == (len(val), heads + 1)
    assert list(m.aucs) == ['cosine']


@pytest.mark.parametrize('name', sorted(MODELS))
def test_attention_auc_matches_the_mixing_matrix_row_and_sklearn(data, configs, name):
    sklearn_metrics = pytest.importorskip('sklearn.metrics')
    _, _, val = data
    backbone = load_model(ModelSpec(name, configs[name]))
    m = measure_backbone(backbone, val, [0, -1], batch_size=5,
                         map_methods=('attention', 'cosine'))
    assert list(m.aucs) == ['attention', 'cosine']
    api = as_backbone(backbone)
    last = api.num_layers - 1
    # independent route: the materialised float64 matrix, the readout's row,
    # patches in raster order; 'combined' = the mean of the two SSD directions
    mixer = copy.deepcopy(api.token_mixer(last)).double()
    u = capture_mixer_inputs(backbone, val.images, [last])[last].double()
    mats = mixing_matrices(mixer, u, torch.float64)
    M = mats['attention'] if name == 'linearvit' else \
        (mats['forward'] + mats['backward']) / 2
    with torch.no_grad():
        layout = api.forward_intermediates(val.images[:1], [last]).layout
    h, w = layout.hw
    row = M[:, :, layout.readout].mean(2)[..., layout.patches]
    maps = F.interpolate(row.reshape(*row.shape[:2], h, w).float(), size=(SIZE, SIZE),
                         mode='bilinear', align_corners=False)
    maps = torch.cat([maps, maps.mean(1, keepdim=True)], 1)
    for b in range(len(val)):
        fg = (val.label_maps[b] > 0).reshape(-1).numpy()
        for j in range(maps.shape[1]):
            expected = sklearn_metrics.roc_auc_score(fg, maps[b, j].reshape(-1).numpy())
            # float32 against float64 maps: near-ties may order differently
            assert m.aucs['attention'][last][b, j] == pytest.approx(expected, abs=2e-3)
    with pytest.raises(ValueError, match='map_methods'):
        measure_backbone(backbone, val, map_methods=('gradcam', ))
    with pytest.raises(ValueError, match='map_methods'):
        measure_backbone(backbone, val, map_methods='cosine')


def test_knn_hits_match_brute_force(data, configs):
    _, train, val = data
    backbone = load_model(ModelSpec('v', configs['dinovim']))
    tm = measure_backbone(backbone, train, with_maps=False)
    vm = measure_backbone(backbone, val, [-1], with_maps=False)
    hits = knn_hits(tm, train.labels, vm, val.labels, 1, k=5, temperature=0.1)
    bank = tm.readouts[1].double().numpy()
    bank /= np.linalg.norm(bank, axis=1, keepdims=True)
    for q, y, hit in zip(vm.readouts[1].double().numpy(), val.labels.tolist(), hits):
        sims = bank @ (q / np.linalg.norm(q))
        votes = np.zeros(3)
        for i in np.argsort(-sims)[:5]:
            votes[train.labels[i]] += np.exp(sims[i] / 0.1)
        assert hit == float(np.argmax(votes) == y)
    with pytest.raises(ValueError, match='was not measured'):
        knn_hits(tm, train.labels, vm, val.labels, 0)


@pytest.mark.parametrize('name', sorted(MODELS))
def test_ranks_match_matrix_rank(data, configs, name):
    _, _, val = data
    backbone = load_model(ModelSpec(name, configs[name]))
    images = val.images[:2]
    rows = rank_by_layer(backbone, images, chunk=4)
    api = as_backbone(backbone)
    assert [r['layer'] for r in rows] == list(range(api.num_layers))
    for row in rows:
        mixer = copy.deepcopy(api.token_mixer(row['layer'])).double()
        for i in range(len(images)):
            u = capture_mixer_inputs(backbone, images[i:i + 1],
                                     [row['layer']])[row['layer']].double()
            M = mixing_matrices(mixer, u, torch.float64)[row['key']][0]
            expected = torch.linalg.matrix_rank(M).double().mean().item()
            assert row['rank'][i] == pytest.approx(expected)
        assert row['rank'][0] <= row['global_bound']
    assert {r['kind'] for r in rows} == {'ssd' if name == 'dinovim' else 'linear'}


def test_bad_config_and_checkpoint_errors(tmp_path, configs):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        load_model(ModelSpec('a', str(tmp_path / 'missing.py')))
    broken = tmp_path / 'broken.py'
    broken.write_text('model = dict(\n')
    with pytest.raises(ValueError, match='could not be read'):
        load_model(ModelSpec('a', str(broken)))
    empty = tmp_path / 'empty.py'
    empty.write_text('x = 1\n')
    with pytest.raises(ValueError, match='no `model`'):
        load_model(ModelSpec('a', str(empty)))
    unknown = write_config(str(tmp_path), 'unknown', dict(type='NoSuchBackbone'))
    with pytest.raises(ValueError, match='does not build a backbone'):
        load_model(ModelSpec('a', unknown))
    with pytest.raises(FileNotFoundError, match='checkpoint'):
        load_model(ModelSpec('a', configs['dinovim'], str(tmp_path / 'no.pth')))
    other = load_model(ModelSpec('b', configs['linearvit']))
    ckpt = str(tmp_path / 'linearvit.pth')
    torch.save(dict(state_dict=other.state_dict()), ckpt)
    with pytest.raises(ValueError, match="model 'a'.*does not fit"):
        load_model(ModelSpec('a', configs['dinovim'], ckpt))


def test_checkpoint_is_loaded(tmp_path, configs, data):
    _, _, val = data
    trained = load_model(ModelSpec('a', configs['dinovim']), seed=5)
    ckpt = str(tmp_path / 'dinovim.pth')
    torch.save(dict(state_dict={f'backbone.{k}': v
                                for k, v in trained.state_dict().items()}), ckpt)
    loaded = load_model(ModelSpec('b', configs['dinovim'], ckpt), seed=0)
    fresh = load_model(ModelSpec('c', configs['dinovim']), seed=0)
    for key, value in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    assert not all(torch.equal(fresh.state_dict()[k], v)
                   for k, v in trained.state_dict().items())


def test_compare_models_and_cli_report(tmp_path, data, configs, load_tool):
    root, train, val = data
    tool = load_tool('tools/analysis/compare_mixers.py')
    out = str(tmp_path / 'report')
    tool.main(['--out-dir', out, '--data-root', root, '--img-size', str(SIZE),
               '--model', 'vim', configs['dinovim'], 'random',
               '--model', 'lin', configs['linearvit'], 'random',
               '--pair', 'lin', 'vim',
               '--rank-images', '1', '--chunk', '4', '--num-resamples', '50',
               '--no-progress'])
    with open(osp.join(out, 'report.json')) as f:
        report = json.load(f)
    assert [m['name'] for m in report['models']] == ['vim', 'lin']
    # the report holds what compare_models measures, on the same seed
    direct = compare_models([ModelSpec('vim', configs['dinovim'])], train, val,
                            rank_images=1, chunk=4, num_resamples=50,
                            progress=False, map_methods=('attention', 'cosine'))
    assert report['meta']['map_methods'] == ['attention', 'cosine']
    direct = direct['models'][0]
    assert report['models'][0]['knn'] == pytest.approx(direct['knn'])
    for method in ('attention', 'cosine'):
        assert report['models'][0]['auc_by_method'][method][1]['auc'] == \
            pytest.approx(direct['auc_by_method'][method][1]['auc'])
    # the headline is the first method (the CLI's default: attention)
    assert report['models'][0]['auc_by_layer'] == report['models'][0][
        'auc_by_method']['attention']
    for name in ('report.md', 'auc_vs_depth.png', 'rank_vs_depth.png',
                 'activation_maps.png'):
        assert osp.getsize(osp.join(out, name)) > 0
    with open(osp.join(out, 'report.md')) as f:
        text = f.read()
    assert '| vim | ssd |' in text and '| lin | linear |' in text
    assert 'Binary-AUC (attention map), last block' in text
    assert '## Binary-AUC by block, cosine map' in text
    ci = report['models'][1]['knn']
    assert ci['low'] <= ci['mean'] <= ci['high'] and ci['num'] == len(val)
    # --pair: lin's gain over vim, the difference of their per-image values
    [pair] = report['pairs']
    assert (pair['model'], pair['base']) == ('lin', 'vim')
    assert pair['knn']['mean'] == pytest.approx(
        report['models'][1]['knn']['mean'] - report['models'][0]['knn']['mean'])
    assert set(pair['auc']) == {'attention', 'cosine'}
    assert '## Paired gains (last block)' in text and '| lin | vim |' in text
    knn_gain = 100 * pair['knn']['mean']
    assert f'| lin | vim | {knn_gain:+.1f} [' in text  # gains carry their sign


def test_per_image_values_and_paired_gain(data, configs):
    """The per-image values behind each summary, and the gain of one model over
    another on the same images against a direct loop over the bootstrap draws."""
    _, train, val = data
    report = compare_models([ModelSpec('vim', configs['dinovim']),
                             ModelSpec('lin', configs['linearvit'])], train, val,
                            rank_images=0, num_resamples=200, progress=False,
                            map_methods=('attention', 'cosine'))
    vim, lin = report['models']
    for m in (vim, lin):
        assert m['per_image']['knn'].shape == (len(val), )
        assert m['per_image']['knn'].mean() == pytest.approx(m['knn']['mean'])
        for method in ('attention', 'cosine'):
            values = m['per_image']['auc'][method]
            assert values.shape == (len(val), )
            assert np.nanmean(values) == pytest.approx(
                m['auc_by_method'][method][-1]['auc']['mean'])
    for measure, a, b in (('knn', vim['per_image']['knn'], lin['per_image']['knn']),
                          ('cosine', vim['per_image']['auc']['cosine'],
                           lin['per_image']['auc']['cosine'])):
        gain = paired_gain(vim, lin, measure, num_resamples=200, seed=3)
        keep = ~(np.isnan(a) | np.isnan(b))
        diff = (b - a)[keep]
        draws = np.random.default_rng(3).integers(0, diff.size, (200, diff.size))
        means = np.array([diff[row].mean() for row in draws])
        assert gain.mean == pytest.approx(diff.mean())
        assert gain.num == keep.sum()
        assert (gain.low, gain.high) == pytest.approx(
            tuple(np.percentile(means, [2.5, 97.5])))
    # measuring the last block only gives the same last-block figures
    last = compare_models([ModelSpec('vim', configs['dinovim'])], train, val,
                          rank_images=0, num_resamples=200, progress=False,
                          map_methods=('attention', 'cosine'),
                          layers=[-1])['models'][0]
    assert last['knn'] == pytest.approx(vim['knn']) and last['depth'] == 2
    assert [r['layer'] for r in last['auc_by_method']['attention']] == [1]
    assert last['auc_by_method']['attention'][0]['auc'] == pytest.approx(
        vim['auc_by_method']['attention'][-1]['auc'])
    np.testing.assert_array_equal(last['per_image']['knn'], vim['per_image']['knn'])
    # named pairs: the same gains, every map method
    [pair] = paired_gains(report, [('lin', 'vim')], num_resamples=200, seed=3)
    assert pair['knn'] == paired_gain(vim, lin, 'knn', 200, 3).as_dict()
    assert pair['auc']['cosine'] == paired_gain(vim, lin, 'cosine', 200, 3).as_dict()
    assert set(pair['auc']) == {'attention', 'cosine'}
    with pytest.raises(ValueError, match="no model 'x'"):
        paired_gains(report, [('lin', 'x')])
    # models of different depths side by side: each is measured at every one of
    # its own blocks, the same as alone
    deeper = write_config(osp.dirname(configs['linearvit']), 'deeper', dict(
        MODELS['linearvit'], arch=dict(MODELS['linearvit']['arch'], num_layers=3)))
    both = compare_models([ModelSpec('vim', configs['dinovim']),
                           ModelSpec('deep', deeper)], train, val, rank_images=0,
                          num_resamples=200, progress=False)['models']
    alone = compare_models([ModelSpec('deep', deeper)], train, val, rank_images=0,
                           num_resamples=200, progress=False)['models'][0]
    assert [r['layer'] for r in both[1]['auc_by_method']['cosine']] == [0, 1, 2]
    assert both[1]['knn'] == pytest.approx(alone['knn'])
    # a model against itself gains exactly nothing
    same = paired_gain(vim, vim, 'attention')
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="'vim' has no 'grad' map"):
        paired_gain(vim, lin, 'grad')
    shorter = dict(lin, per_image=dict(knn=lin['per_image']['knn'][:-1], auc={}))
    with pytest.raises(ValueError, match='measured on different images'):
        paired_gain(vim, shorter)
    # the per-image values go into the JSON report, as plain lists (nan: None),
    # so that every paired statistic can be recomputed from it
    from mmdinomamba.studies.comparison.report import _json_ready
    stored = _json_ready(report)['models'][0]['per_image']
    assert stored['knn'] == report['models'][0]['per_image']['knn'].tolist()
    assert all(v is None or isinstance(v, float) for v in stored['auc']['cosine'])


def test_cli_bad_inputs_exit_with_a_message(tmp_path, data, configs, load_tool):
    root, _, _ = data
    tool = load_tool('tools/analysis/compare_mixers.py')
    base = ['--out-dir', str(tmp_path / 'r'), '--data-root', root, '--img-size',
            str(SIZE), '--no-progress']
    with pytest.raises(SystemExit, match='checkpoint .* does not exist'):
        tool.main(base + ['--model', 'vim', configs['dinovim'],
                          str(tmp_path / 'missing.pth')])
    with pytest.raises(SystemExit, match='names no --model'):
        tool.main(base + ['--model', 'vim', configs['dinovim'], 'random',
                          '--probe', 'other', configs['dinovim'], 'x.pth'])
    with pytest.raises(SystemExit, match="--pair vim x: 'x' names no --model"):
        tool.main(base + ['--model', 'vim', configs['dinovim'], 'random',
                          '--pair', 'vim', 'x'])
    with pytest.raises(SystemExit, match='given twice'):
        tool.main(base + ['--model', 'v', configs['dinovim'], 'random',
                          '--model', 'v', configs['dinovim'], 'random'])


def test_reference_maps_match_sklearn_and_the_maps_of_a_grey_image(data, configs):
    """The centre prior's AUC on each image equals sklearn's on the fixed Gaussian;
    the grey image's head-mean map equals ``measure_maps`` on that image, and its
    per-image AUC (mean over heads) equals sklearn on each head's map; each
    model's gains over both are the paired differences of the stored per-image
    values."""
    from sklearn.metrics import roc_auc_score

    from mmdinomamba.studies.comparison.measures import (centred_gaussian_map,
                                                 grey_image_maps, measure_maps,
                                                 preprocess_image)
    _, train, val = data
    report = compare_models([ModelSpec('vim', configs['dinovim'])], train, val,
                            rank_images=0, num_resamples=100, progress=False,
                            map_methods=('attention', 'cosine'))
    prior = report['reference']['centred_gaussian']
    g = centred_gaussian_map(SIZE).numpy()
    assert g.argmax() in {(SIZE // 2 - 1) * SIZE + SIZE // 2 - 1, (SIZE // 2) * SIZE +
                          SIZE // 2}  # brightest at the centre
    fg = (val.label_maps > 0).numpy()
    expected = [roc_auc_score(f.ravel(), g.ravel()) if 0 < f.sum() < f.size
                else np.nan for f in fg]
    np.testing.assert_allclose(prior['per_image'], expected, atol=1e-12)
    assert prior['auc']['mean'] == pytest.approx(np.nanmean(expected))
    vim = report['models'][0]
    backbone = load_model(ModelSpec('vim', configs['dinovim']))
    grey = grey_image_maps(backbone, SIZE, 1, ('attention', 'cosine'))
    image = preprocess_image(np.full((SIZE, SIZE, 3), 128, np.uint8), SIZE)[None]
    for method in ('attention', 'cosine'):
        maps = grey[method].numpy()
        np.testing.assert_allclose(maps[-1], measure_maps(backbone, image, method)[0],
                                   atol=1e-5)
        heads = maps[:-1]
        expected = [np.mean([roc_auc_score(f.ravel(), h.ravel()) for h in heads])
                    if 0 < f.sum() < f.size else np.nan for f in fg]
        np.testing.assert_allclose(vim['per_image']['auc_grey'][method], expected,
                                   atol=1e-9)
        own = vim['per_image']['auc'][method]
        ref = vim['reference'][method]
        for key, base in (('gain_over_grey', np.array(expected)),
                          ('gain_over_prior', prior['per_image'])):
            keep = ~(np.isnan(own) | np.isnan(base))
            assert ref[key]['mean'] == pytest.approx((own - base)[keep].mean())
            assert ref[key]['low'] <= ref[key]['mean'] <= ref[key]['high']


def test_report_json_stores_the_pairs_and_relative_paths(tmp_path, data, configs,
                                                         monkeypatch):
    """report.json is valid JSON (nan as null) with the per-image values, and the
    paths relative to the folder the tool ran in."""
    from mmdinomamba.studies.comparison.report import _probe, write_comparison_report
    _, train, val = data
    monkeypatch.chdir(osp.dirname(configs['dinovim']))
    report = compare_models([ModelSpec('vim', configs['dinovim']),
                             ModelSpec('lin', configs['linearvit'])], train, val,
                            rank_images=0, num_resamples=50, progress=False,
                            map_methods=('attention', ))
    report['pairs'] = paired_gains(report, [('lin', 'vim')], num_resamples=50)
    out = str(tmp_path / 'r')
    write_comparison_report(report, out, np.zeros((4, SIZE, SIZE, 3), np.uint8),
                            val.label_maps[:4].numpy())
    with open(osp.join(out, 'report.json')) as f:
        text = f.read()
    assert 'NaN' not in text
    data_ = json.loads(text)
    assert data_['models'][0]['config'] == 'dinovim.py'
    assert len(data_['models'][1]['per_image']['auc']['attention']) == len(val)
    pair = data_['pairs'][0]
    assert pair['order']['knn'] in ('better', 'worse', 'tie')
    with open(osp.join(out, 'report.md')) as f:
        md = f.read()
    assert f'{pair["order"]["attention"]} |' in md
    # the demo's probe: the top-1 its run printed, when the report does not score it
    assert _probe(dict(probe=None, probe_logged=0.853)) == "85.3 (its run's validation)"
    assert _probe(dict(probe=None)) == '—'


def test_progress_without_a_terminal_is_a_line_per_quarter(data, configs, capsys):
    """make demo's last step measured 2000 images for minutes without a word when
    its output was not a terminal: progress is now a line at each quarter."""
    _, _, val = data
    backbone = load_model(ModelSpec('v', configs['linearvit']))
    measure_backbone(backbone, val, [-1], with_maps=False, batch_size=2,
                     progress=True, label='vit: held-out images')
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    n = len(val)
    counts = [line.split(' [')[0].rsplit(' ', 1)[-1] for line in lines]
    assert all(line.startswith('vit: held-out images ') for line in lines), lines
    assert counts[-1] == f'{n}/{n}' and 4 <= len(lines) <= 5, lines
    measure_backbone(backbone, val, [-1], with_maps=False, batch_size=2)
    assert capsys.readouterr().out == ''  # progress=False stays silent


def test_probe_checkpoint_must_fit_the_probe(tmp_path, configs, data):
    """The comparison's probe is filled strictly: a head of another shape or a NaN
    is refused naming the file and the tensor, before anything is scored."""
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS as CLS_MODELS

    from mmdinomamba.studies.comparison.measures import probe_hits
    _, _, val = data
    probe = dict(type='ImageClassifier', backbone=MODELS['dinovim'],
                 head=dict(type='LinearClsHead', num_classes=3, in_channels=32))
    config = str(tmp_path / 'probe.py')
    with open(config, 'w') as f:
        f.write(f'model = {probe!r}\n')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        state = CLS_MODELS.build(probe).state_dict()
    files = {'ok': state,
             'wide': dict(state, **{'head.fc.weight': torch.zeros(4, 32),
                                    'head.fc.bias': torch.zeros(4)}),
             'nan': dict(state, **{'head.fc.bias': torch.full((3, ), float('nan'))})}
    for name, checkpoint in files.items():
        torch.save(dict(state_dict=checkpoint), tmp_path / f'{name}.pth')
    hits = probe_hits(ModelSpec('a', configs['dinovim'], probe_config=config,
                                probe_checkpoint=str(tmp_path / 'ok.pth')), val)
    assert hits.shape == (len(val), )
    for name, message in (('wide', r'head\.fc\.weight: \(4, 32\) vs \(3, 32\)'),
                          ('nan', r'1 tensors hold NaN or infinite values: '
                           r'head\.fc\.bias')):
        path = str(tmp_path / f'{name}.pth')
        with pytest.raises(ValueError, match=f'probe checkpoint {path} does not fit '
                           f'{config}: .*{message}'):
            probe_hits(ModelSpec('a', configs['dinovim'], probe_config=config,
                                 probe_checkpoint=path), val)
