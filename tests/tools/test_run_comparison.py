"""tools/run_comparison.py: the 'compare' preset of the recipe, end to end on a CPU
with a tiny budget (the recipe's parts: tests/studies/test_recipe.py)."""
import glob
import json
import os.path as osp
import re

import numpy as np
import pytest

from mmdinomamba.studies.comparison.measures import repo_relative
from mmdinomamba.studies.comparison.recipe import COMPARE_MODELS, SEQ256_MODELS

NAMES = [m.name for m in COMPARE_MODELS]
# the recipe on a CPU in seconds: 2-layer models, one epoch of DINO and of each probe
# (on the last two blocks), 2 training and 1 held-out image a class, one rank image
TINY_CPU_BUDGET = [
    '--epochs', '1', '--device', 'cpu', '--train-per-class', '2',
    '--val-per-class', '1', '--rank-images', '1', '--parallel',
    '--num-workers', '0', '--cfg-options',
    'train_dataloader.batch_size=8', 'model.backbone.arch.num_layers=2',
    'model.head.out_channels=64', 'model.loss.out_channels=64',
    '--probe-epochs', '1', '--probe-cfg-options',
    'model.backbone.out_indices=[-2,-1]', 'model.backbone.frozen_stages=2',
    'model.neck.in_channels=384', 'model.head.in_channels=384',
    'train_dataloader.batch_size=8']


@pytest.fixture(scope='module')
def script(load_tool):
    return load_tool('tools/run_comparison.py')


@pytest.mark.slow
def test_cpu_run_end_to_end(tmp_path, script, capsys):
    """--device cpu (float32 training, no AMP) through every model of the table."""
    pytest.importorskip('mmpretrain')
    work = str(tmp_path / 'cmp')
    script.main([
        '--work-dir', work, '--data-root', str(tmp_path / 'data'), *TINY_CPU_BUDGET])
    out = capsys.readouterr().out
    for step in range(1, 6):
        assert f'[{step}/5] ' in out
    assert 'mmengine - INFO' not in out  # the libraries' logs are in the log files
    with open(osp.join(work, 'report', 'report.json')) as f:
        report = json.load(f)
    models = {m['name']: m for m in report['models']}
    assert list(models) == [f'{n}-{row}' for n in NAMES for row in ('dino', 'random')]
    for name in NAMES:  # the random init, then the end
        with open(osp.join(work, f'dino_{name}.log')) as f:
            log = f.read()
        start = re.search(r'k-NN \(k=20, T=0.07\) of teacher.backbone at iteration 0: '
                          r'top-1 ([0-9.]+) %', log)
        assert start is not None
        assert 'at iteration 3: top-1' in log  # 24 images, batches of 8
        assert 'AmpOptimWrapper' not in log
        # "random init" is the run's own start (InitialWeightsHook's init.pth):
        # the report's k-NN of it equals the hook's at iteration 0, same images
        random = models[f'{name}-random']
        assert random['checkpoint'] == repo_relative(osp.join(work, f'{name}_init.pth'))
        assert not random['checkpoint'].startswith('/')
        assert 100 * random['knn']['mean'] == pytest.approx(float(start.group(1)),
                                                            abs=0.006)
        # each probe row is its tools/train.py run's own validation (mmpretrain's
        # Accuracy on the same held-out images through the test pipeline)
        for row in ('dino', 'random'):
            model = models[f'{name}-{row}']
            probe_dir = osp.join(work, f'probe_{name}_{row}')
            scalars, = glob.glob(osp.join(probe_dir, '*', 'vis_data', 'scalars.json'))
            with open(scalars) as f:
                top1 = [json.loads(line)['accuracy/top1'] for line in f
                        if 'accuracy/top1' in line]
            assert len(top1) == 1
            assert 100 * model['probe']['mean'] == pytest.approx(top1[0], abs=1e-4)
            assert model['probe_checkpoint'] == repo_relative(
                osp.join(probe_dir, 'epoch_1.pth'))
            assert f'{name}-{row}: top-1 on the held-out images {top1[0]:.1f} %' in out
    assert {m['kind'] for m in report['models']} == {'softmax', 'ssd', 'linear', 'mlla'}
    assert all(m['depth'] == 2 for m in report['models'])
    assert report['meta']['num_val'] == 12
    # each teacher's paired gain over its own start
    assert [(p['model'], p['base']) for p in report['pairs']] == [
        (f'{n}-dino', f'{n}-random') for n in NAMES]
    for pair in report['pairs']:
        assert pair['knn']['mean'] == pytest.approx(
            models[pair['model']]['knn']['mean'] - models[pair['base']]['knn']['mean'])
        # beside it, the teacher's paired gain over the centre prior
        ref = models[pair['model']]['reference']['attention']
        assert set(ref) == {'grey', 'gain_over_grey', 'gain_over_prior'}
    # the data has no centre bias by default: the stamp names the placement
    with open(osp.join(str(tmp_path / 'data'), 'toy_data.json')) as f:
        assert json.load(f)['placement'] == 'uniform'
    assert 'uniform placement' in out
    # the reference rows: the centre prior once, the grey image per model, and the
    # per-image values behind every paired gain in the JSON
    prior = report['reference']['centred_gaussian']
    assert len(prior['per_image']) == 12 and prior['sigma'] == 0.25
    for model in report['models']:
        per_image = model['per_image']
        assert len(per_image['knn']) == 12
        for method in ('attention', 'cosine'):
            own = np.array(per_image['auc'][method], dtype=float)
            grey = np.array(per_image['auc_grey'][method], dtype=float)
            gain = model['reference'][method]['gain_over_grey']
            keep = ~(np.isnan(own) | np.isnan(grey))
            assert gain['mean'] == pytest.approx((own - grey)[keep].mean())
    # the paired gains between the teachers, each with its order word
    teachers = [f'{n}-dino' for n in NAMES]
    assert [(p['model'], p['base']) for p in report['between']] == [
        (b, a) for i, a in enumerate(teachers) for b in teachers[i + 1:]]
    for pair in report['pairs'] + report['between']:
        for measure, word in pair['order'].items():
            gain = pair['knn'] if measure == 'knn' else pair['auc'][measure]
            assert word == ('better' if gain['low'] > 0 else 'worse'
                            if gain['high'] < 0 else 'tie')
    with open(osp.join(work, 'report', 'report.md')) as f:
        text = f.read()
    assert '## Reference maps (last block)' in text and '| *centre prior* |' in text
    assert '## Between the models (last block, paired)' in text
    assert '/tmp' not in json.dumps(report) and str(tmp_path) not in text
    for name in ('report.md', 'auc_vs_depth.png', 'rank_vs_depth.png',
                 'activation_maps.png'):
        assert osp.getsize(osp.join(work, 'report', name)) > 0
    assert f'Figure: {osp.join(work, "report", "activation_maps.png")}' in out


@pytest.mark.slow
def test_cpu_run_at_256_tokens_end_to_end(tmp_path, script, capsys):
    """--preset seq256 through every model of its table, the report at --out:
    256 patch tokens each (+ [CLS] slots), where a linear-attention head of width
    64 caps its mixing matrix's rank below the sequence length."""
    pytest.importorskip('mmpretrain')
    work, out = str(tmp_path / 'cmp'), str(tmp_path / 'report256')
    script.main([
        '--preset', 'seq256', '--work-dir', work, '--data-root', str(tmp_path / 'data'),
        '--out', out, *TINY_CPU_BUDGET])
    stdout = capsys.readouterr().out
    for step in range(1, 6):
        assert f'[{step}/5] ' in stdout
    assert not osp.exists(osp.join(work, 'report'))
    with open(osp.join(out, 'report.json')) as f:
        report = json.load(f)
    names = [m.name for m in SEQ256_MODELS]
    assert [m['name'] for m in report['models']] == [
        f'{n}-{row}' for n in names for row in ('dino', 'random')]
    tokens = {'softmax': 257, 'ssd': 258, 'linear': 257, 'mlla': 256}
    for model in report['models']:
        assert model['depth'] == 2 and model['probe'] is not None
        for block in model['ranks']:
            assert block['seqlen'] == tokens[model['kind']]
            assert block['within_bounds']
            if model['kind'] == 'linear':  # the bound bites: rank <= D_QK < N
                assert max(block['rank']) <= block['d_qk'] == 64 < block['seqlen']
    for name in ('report.md', 'auc_vs_depth.png', 'rank_vs_depth.png',
                 'activation_maps.png'):
        assert osp.getsize(osp.join(out, name)) > 0
    assert f'Report: {osp.join(out, "report.md")}' in stdout
