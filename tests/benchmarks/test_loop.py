"""benchmarks/benchmark.py's loop mode: tools/train.py with the shipped configs on
synthetic ImageNet-layout data, s/iter, images/s and peak memory from its log."""
import json
import os.path as osp

import pytest
from mmengine.config import Config

from benchmarks import names
from benchmarks.modes import loop as loop_mode


@pytest.fixture(scope='module')
def bench(load_tool):
    """The command line (its modes are the modules imported above)."""
    return load_tool('benchmarks/benchmark.py')


def test_loop_config_trains_the_shipped_config_for_the_timed_epoch(bench, tmp_path):
    cfg, batch = loop_mode.loop_config(names.CLS_CONFIGS['mlla-tiny'], 'cls', str(tmp_path),
                                   iters=30, batch=4, size=1024, workers=3,
                                   log_interval=10, compile_mode='max-autotune')
    loader = cfg.train_dataloader
    assert batch == loader.batch_size == 4 and loader.dataset.indices == 4 * 30
    assert loader.num_workers == 3 and loader.persistent_workers
    assert loader.dataset.data_root == str(tmp_path) and cfg.train_cfg.max_epochs == 1
    # the warm-up acts in the first epoch; the cosine begins at epoch 20
    assert [s['type'] for s in cfg.param_scheduler] == ['LinearLR']
    (crop, ) = [t for t in loader.dataset.pipeline if t['type'] == 'RandomResizedCrop']
    assert crop['scale'] == 1024 and cfg.model.backbone.img_size == 1024
    assert cfg.default_hooks.logger.interval == 10
    assert cfg.default_hooks.checkpoint.interval > 30
    assert not cfg.default_hooks.checkpoint.save_last
    assert cfg.custom_hooks[0]['type'] == 'EMAHook'  # the config's own hooks stay
    assert cfg.custom_hooks[-1] == dict(type='CompileModulesHook', modules=['backbone'],
                                        mode='max-autotune', dynamic=False)
    # the baselines' configs come from mmpretrain's package, at their own batch
    for name in ('vit-base', 'swin-tiny'):
        cfg, batch = loop_mode.loop_config(names.CLS_CONFIGS[name], 'cls', str(tmp_path),
                                       iters=20, size=224)
        assert batch == cfg.train_dataloader.batch_size == 64
        assert cfg.model.backbone.img_size == 224
        assert not any(h['type'] == 'CompileModulesHook'
                       for h in cfg.get('custom_hooks', []))


def test_a_compiled_dino_run_is_the_compile_config(bench, tmp_path):
    """``dinovim-tiny+compile`` in the DINO loop trains what the shipped -compile
    config says (its hooks: the graphed blocks, then both backbones compiled)."""
    config = osp.join(names.CONFIG_DIR, names.DINO_CONFIGS['dinovim-tiny'])
    cfg, batch = loop_mode.loop_config(config, 'dino', str(tmp_path), iters=20,
                                   compile_mode='reduce-overhead')
    shipped = Config.fromfile(config.replace('-amp-100e', '-amp-compile-100e'))
    assert cfg.custom_hooks == shipped.custom_hooks and batch == 48
    with pytest.raises(ValueError, match='--size sets a classification crop'):
        loop_mode.loop_config(config, 'dino', str(tmp_path), iters=20, size=224)


LOG = """12/05 10:43:37 - mmengine - INFO - Config: data_time_limit = 3
Epoch(train) [1][10/30]  lr: 1e-3  eta: 0:00:10  time: 0.5000  data_time: 0.2000  memory: 2048  loss: 6.9
Epoch(train) [1][20/30]  lr: 1e-3  eta: 0:00:05  time: 0.1000  data_time: 0.0100  memory: 3072  loss: 6.8
Epoch(train) [1][30/30]  lr: 1e-3  eta: 0:00:00  time: 0.3000  data_time: 0.0300  memory: 1024  loss: 6.7
"""


def test_read_train_log_skips_the_first_window(bench):
    res = loop_mode.read_train_log(LOG)
    assert res['windows'] == [0.5, 0.1, 0.3]
    assert res['s_iter'] == pytest.approx(0.2) and res['data_time'] == pytest.approx(0.02)
    assert res['peak_gib'] == 3.0  # MiB of the highest window
    cpu = loop_mode.read_train_log(LOG.replace('memory: ', 'mem '))
    assert cpu['peak_gib'] is None and cpu['s_iter'] == pytest.approx(0.2)
    one = loop_mode.read_train_log(LOG.splitlines()[1])
    assert 'two' in one['error'] and 's_iter' not in one


def test_ratios_refer_to_the_baseline_with_the_same_compile(bench):
    rows = [dict(model='vit-base', img_s=100.0), dict(model='mlla-tiny', img_s=50.0),
            dict(model='vit-base+compile', img_s=200.0),
            dict(model='mlla-tiny+compile', img_s=100.0),
            dict(model='swin-tiny', error='OOM')]
    loop_mode.add_loop_ratios(rows, 'vit-base')
    assert [r.get('img_s_vs_baseline') for r in rows] == [1.0, 0.5, 1.0, 0.5, None]
    assert rows[3]['baseline'] == 'vit-base+compile'
    del rows[2]  # no compiled baseline: the eager one
    loop_mode.add_loop_ratios(rows, 'vit-base')
    assert rows[2]['img_s_vs_baseline'] == 1.0 and rows[2]['baseline'] == 'vit-base'


def test_the_baseline_joins_unless_named(bench, tmp_path, monkeypatch):
    """ViT-B is measured first, unless the call names it (eager or compiled); a
    run that fails is reported and the next one runs."""
    monkeypatch.setattr(loop_mode, 'loop_config',
                        lambda config, *args: (Config(dict(name=config)), 2))
    monkeypatch.setattr(loop_mode, 'synthetic_images', lambda root, n: None)
    failed = type('Done', (), dict(returncode=1))
    monkeypatch.setattr(loop_mode.subprocess, 'run', lambda cmd, **kwargs: failed())
    kwargs = dict(root=str(tmp_path), work_dir=str(tmp_path), iters=20)
    for names, measured in [
            (['mlla-t'], ['vit-base', 'mlla-tiny']),
            (['vit-b+compile', 'mlla-t+compile'], ['vit-base+compile',
                                                   'mlla-tiny+compile']),
            (['mlla-t', 'vit-base'], ['mlla-tiny', 'vit-base'])]:
        rows = loop_mode.run_loop(names, 'cls', **kwargs)
        assert [r['model'] for r in rows] == measured
        assert all('tools/train.py exited with 1' in r['error'] for r in rows)


def test_loop_refuses_what_it_cannot_measure(bench, tmp_path):
    kwargs = dict(root=str(tmp_path), work_dir=str(tmp_path), iters=20)
    with pytest.raises(ValueError, match=r"no cls config for \['dinovim-tiny'\]"):
        loop_mode.run_loop(['mlla-t', 'dinovim-t+compile'], 'cls', **kwargs)
    with pytest.raises(ValueError, match='fewer than two logged windows of 10'):
        loop_mode.run_loop(['mlla-t'], 'cls', str(tmp_path), str(tmp_path), iters=19)
    with pytest.raises(ValueError, match='amp must be one of'):
        loop_mode.run_loop(['mlla-t'], 'cls', amp='int8', **kwargs)
    with pytest.raises(ValueError, match='task must be one of'):
        loop_mode.run_loop(['mlla-t'], 'seg', **kwargs)
    with pytest.raises(ValueError, match='--amp none cannot take AMP out'):
        bench.main(['--amp', 'none', 'loop', '--models', 'mlla-t'])
    assert not list(tmp_path.iterdir())  # refused before writing anything


@pytest.mark.slow
def test_loop_trains_with_tools_train_end_to_end(bench, tmp_path):
    """On the CPU, tiny: two iterations of MLLA-T's ImageNet config at 64 px beside
    ViT-B's (the baseline, measured first), each through tools/train.py in its own
    process, on synthetic JPEGs written for the run; every row is on disk (with
    --out) when the call returns."""
    out, root, work = tmp_path / 'loop.json', tmp_path / 'data', tmp_path / 'work'
    data = bench.main(['--device', 'cpu', '--out', str(out), 'loop', '--task', 'cls',
                       '--models', 'mlla-t', '--size', '64', '--batch', '2',
                       '--train-iters', '2', '--log-interval', '1', '--workers', '0',
                       '--root', str(root), '--work-dir', str(work)])
    vit, mlla = data['rows']
    assert (vit['model'], mlla['model']) == ('vit-base', 'mlla-tiny')
    for r in (vit, mlla):
        assert 'error' not in r, r
        assert len(r['windows']) == 2 and r['s_iter'] == r['windows'][1]
        assert r['img_s'] == pytest.approx(2 / r['s_iter'])
        assert r['peak_gib'] is None  # no CUDA, no logged memory
        trained = Config.fromfile(r['run_config'])
        (crop, ) = [t for t in trained.train_dataloader.dataset.pipeline
                    if t['type'] == 'RandomResizedCrop']
        assert crop['scale'] == 64 and osp.isfile(r['log'])
    assert mlla['img_s_vs_baseline'] == pytest.approx(mlla['img_s'] / vit['img_s'])
    assert len((root / 'meta' / 'train.txt').read_text().splitlines()) == 2 * 2
    saved = json.loads(out.read_text())
    assert 'partial' not in saved and saved['rows'] == json.loads(json.dumps(data['rows']))
