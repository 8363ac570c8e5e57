"""tools/analysis/benchmark.py on the CPU with tiny settings."""
import json
import pytest
import torch


@pytest.fixture(scope='module')
def bench(load_tool):
    return load_tool('tools/analysis/benchmark.py')


TINY = dict(type='DinoVim', arch=dict(embed_dims=64, num_layers=2),
            mixer_cfg=dict(d_state=16, headdim=16))
TINY_LINEAR = dict(type='LinearViT', arch=dict(embed_dims=64, num_layers=2,
                                               num_heads=2, mlp_ratio=2))


def test_models_mode_measures_and_ratios(bench):
    rows = bench.run_models({'tiny': TINY, 'base': TINY_LINEAR}, sizes=[32],
                            batches=[2], device=torch.device('cpu'), amp=None,
                            modes=['infer', 'train'], warmup=1, repeats=2, iters=1,
                            baseline='base')
    by_name = {r['model']: r for r in rows}
    tiny, base = by_name['tiny'], by_name['base']
    for r in rows:
        assert 'error' not in r, r
        assert r['infer_img_s'] > 0 and r['train_img_s'] > 0
        assert len(r['train_ms_all']) == 2
        assert r['train_img_s'] == pytest.approx(2e3 / r['train_ms'])
    assert tiny['ssd_path'] == 'chunked'
    assert tiny['infer_vs_baseline'] == pytest.approx(
        tiny['infer_img_s'] / base['infer_img_s'])
    assert base['train_vs_baseline'] == pytest.approx(1.0)


def test_models_mode_reports_errors_and_goes_on(bench):
    rows = bench.run_models({'bad': dict(type='NoSuchNet'), 'tiny': TINY}, sizes=[32],
                            batches=[1], device=torch.device('cpu'), amp=None,
                            modes=['infer'], warmup=0, repeats=1, iters=1,
                            baseline=None)
    assert 'NoSuchNet' in rows[0]['error']
    assert rows[1]['infer_img_s'] > 0


def test_models_mode_needs_one_batch_per_size(bench):
    with pytest.raises(ValueError, match='one batch size per input size'):
        bench.run_models({'tiny': TINY}, sizes=[32, 64], batches=[2],
                         device=torch.device('cpu'), amp=None, modes=['infer'],
                         warmup=0, repeats=1, iters=1)


def test_cli_writes_json(bench, tmp_path):
    out = tmp_path / 'res' / 'bench.json'
    bench.main(['--device', 'cpu', '--amp', 'none', '--warmup', '0', '--repeats', '1',
                '--iters', '1', '--out', str(out), 'kernel', '--backends', 'chunked',
                'ref', 'triton', '--batch', '1', '--seqlen', '20', '--nheads', '2',
                '--headdim', '8', '--dstate', '8'])
    data = json.loads(out.read_text())
    rows = {r['backend']: r for r in data['rows']}
    assert data['mode'] == 'kernel' and data['environment']['device'] == 'cpu'
    assert rows['chunked']['fwd_ms'] > 0 and rows['ref']['fwd_bwd_ms'] > 0
    assert 'CUDA' in rows['triton']['error']  # no GPU here: reported, not raised
    assert list(tmp_path.joinpath('res').iterdir()) == [out]  # no temp files left


def test_profile_mode_splits_a_step_by_operator(bench, tmp_path):
    bench.MODELS['tiny-test'] = TINY
    try:
        out = tmp_path / 'prof.json'
        data = bench.main(['--device', 'cpu', '--amp', 'none', '--warmup', '1',
                           '--iters', '2', '--out', str(out), 'profile', '--model',
                           'tiny-test', '--size', '32', '--batch', '2', '--step', 'train',
                           '--top', '5'])
    finally:
        del bench.MODELS['tiny-test']
    rows = data['rows']
    times = [r['ms_per_step'] for r in rows]
    assert times == sorted(times, reverse=True) and times[-1] > 0
    names = {r['name'] for r in rows}
    # a training step: the projections' matrix products, their backward, AdamW
    assert any('mm' in n for n in names), sorted(names)[:20]
    assert any('Backward' in n or 'backward' in n for n in names)
    assert json.loads(out.read_text())['settings']['step'] == 'train'
    with pytest.raises(ValueError, match="step must be 'infer' or 'train'"):
        bench.profile_model(TINY, 32, 1, torch.device('cpu'), None, 'eval', 0, 1)
