"""The small comparison recipe: its configs, its epochs knob, and a CPU run."""
import glob
import json
import os.path as osp
import re

import pytest
from mmengine.config import Config, DictAction

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture(scope='module')
def script(load_tool):
    return load_tool('tools/run_comparison.py')


def merged(config, options):
    cfg = Config.fromfile(osp.join(REPO, config))
    action = DictAction(option_strings=['--cfg-options'], dest='cfg_options')
    parsed = {}
    for option in options:
        key, value = option.split('=', 1)
        parsed[key] = action._parse_iterable(value)
    cfg.merge_from_dict(parsed)
    return cfg


def test_configs_share_everything_but_the_backbone(script):
    cfgs = {name: Config.fromfile(osp.join(REPO, path))
            for name, path in script.CONFIGS.items()}
    dicts = {}
    for name, cfg in cfgs.items():
        d = cfg.to_dict()
        backbone = d['model'].pop('backbone')
        assert backbone['arch']['embed_dims'] == 192
        assert backbone['arch']['num_layers'] == 12
        assert (backbone['img_size'], backbone['patch_size']) == (64, 8)
        d.pop('filename', None)
        dicts[name] = json.dumps(d, sort_keys=True, default=str)
    assert len(set(dicts.values())) == 1
    assert {c.model.backbone.type for c in cfgs.values()} == {
        'mmpretrain.VisionTransformer', 'DinoVim', 'LinearViT'}


@pytest.mark.parametrize('name', ['vit', 'dinovim', 'linearvit'])
def test_each_probe_reads_its_dino_runs_backbone(script, name):
    """The probe's backbone is the DINO config's, frozen, with the last 4 blocks
    read out, and its init_cfg loads that run's teacher."""
    dino = Config.fromfile(osp.join(REPO, script.CONFIGS[name])).model.backbone
    probe_cfg = Config.fromfile(osp.join(REPO, script.PROBE_CONFIGS[name]))
    probe = probe_cfg.model.backbone.to_dict()
    assert probe.pop('out_indices') == [-4, -3, -2, -1]
    assert probe.pop('frozen_stages') == 12
    init = probe.pop('init_cfg')
    assert init['type'] == 'Pretrained' and init['prefix'] == 'teacher.backbone.'
    assert init['checkpoint'] == f'work_dirs/compare/{name}/epoch_20.pth'
    source = probe.pop('feature_source', None)
    assert source == {'vit': None, 'dinovim': 'mixer', 'linearvit': 'normed'}[name]
    dino = dino.to_dict()
    dino.pop('init_cfg', None)
    assert probe == dino
    assert probe_cfg.model.head.num_classes == script.NUM_CLASSES
    assert probe_cfg.model.head.in_channels == probe_cfg.model.neck.in_channels == 4 * 192
    # ViT's intermediate [CLS] skip the final LayerNorm: the neck normalises them
    assert probe_cfg.model.neck.get('with_bn', False) == (name == 'vit')


def test_probe_options_point_every_loader_at_the_data(script):
    path = script.PROBE_CONFIGS['dinovim']
    cfg = merged(path, script.probe_options('/w/t.pth', '/data/here') +
                 script.probe_epoch_options(3))
    assert cfg.model.backbone.init_cfg.checkpoint == '/w/t.pth'
    assert cfg.model.backbone.init_cfg.prefix is None
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        assert loader.dataset.data_root == '/data/here'
        assert loader.dataset.classes == '/data/here/classes.txt'
    assert cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 3
    cosine, = cfg.param_scheduler
    assert cosine.T_max == cosine.end == cfg.default_hooks.checkpoint.interval == 3
    # a run without init.pth: the probe's backbone is the config's own init
    assert merged(path, script.probe_options(None, '/d')).model.backbone.init_cfg is None
    with pytest.raises(ValueError, match='probe epochs'):
        script.probe_epoch_options(0)


def test_a_finished_probe_is_its_config_dump_and_last_checkpoint(tmp_path, script):
    config = script.PROBE_CONFIGS['vit']
    assert script.finished_probe(str(tmp_path), config) is None  # nothing there
    for epoch in (2, 10):
        (tmp_path / f'epoch_{epoch}.pth').write_bytes(b'')
    assert script.finished_probe(str(tmp_path), config) is None  # no config dump
    dump = tmp_path / osp.basename(config)
    dump.write_text('')
    assert script.finished_probe(str(tmp_path), config) == (
        str(dump), str(tmp_path / 'epoch_10.pth'))


def test_blur_is_dinos_range_scaled_to_the_crops(script):
    from mmdinomamba.datasets.transforms.dino_multicrop import BLUR_RADIUS
    cfg = Config.fromfile(osp.join(REPO, script.CONFIGS['vit']))
    crop, = [t for t in cfg.train_pipeline if t['type'] == 'DINOMultiCrop']
    # DINO's range is set for 224 px global crops; ours are 64 px
    scale = crop['global_size'] / 224
    assert crop['blur_radius'] == pytest.approx([r * scale for r in BLUR_RADIUS],
                                                abs=0.005)
    assert cfg.train_dataloader.dataset.pipeline == cfg.train_pipeline


@pytest.mark.parametrize('epochs', [1, 7, 40])
def test_schedule_options_end_every_schedule_with_the_run(script, epochs):
    cfg = merged(script.CONFIGS['vit'], script.schedule_options(epochs))
    assert cfg.train_cfg.max_epochs == epochs
    warmup, cosine, decay = cfg.param_scheduler
    assert cosine.end == decay.end == epochs
    assert cosine.begin == warmup.end or epochs == 1
    assert cosine.T_max == max(epochs - cosine.begin, 1)
    assert warmup.begin == decay.begin == 0 and cosine.begin < cosine.end
    with pytest.raises(ValueError, match='epochs'):
        script.schedule_options(0)


def test_the_knn_monitor_reads_the_runs_data_root(script):
    for path in script.CONFIGS.values():
        options = script.knn_data_options(path, '/data/here')
        assert len(options) == 2
        cfg = merged(path, options)
        hook, = [h for h in cfg.custom_hooks if h.type == 'KNNMonitorHook']
        bank, query = hook.bank_dataloader.dataset, hook.query_dataloader.dataset
        assert bank.data_root == query.data_root == '/data/here'
        assert (bank.ann_file, query.ann_file) == ('meta/train.txt', 'meta/val.txt')
    assert script.knn_data_options('configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py',
                                   '/x') == []


def test_a_failed_parallel_run_stops_the_others(tmp_path, script):
    """--parallel: when one run fails, the script exits with its log and no other
    run is left going."""
    import sys
    slow = script.start_step('slow', [sys.executable, '-c',
                                      'import time; time.sleep(60)'], str(tmp_path))
    bad = script.start_step('bad', [sys.executable, '-c',
                                    'import sys; print("boom"); sys.exit(3)'],
                            str(tmp_path))
    with pytest.raises(SystemExit, match=r"(?s)'bad' failed \(exit status 3\).*boom"):
        script.finish_all([bad, slow])
    assert slow[1].poll() is not None  # stopped, not left running


def test_cpu_run_end_to_end(tmp_path, script):
    pytest.importorskip('mmpretrain')
    work = str(tmp_path / 'cmp')
    script.main(['--work-dir', work, '--data-root', str(tmp_path / 'data'),
                 '--epochs', '1', '--device', 'cpu', '--train-per-class', '2',
                 '--val-per-class', '1', '--rank-images', '1', '--parallel',
                 '--cfg-options',
                 'optim_wrapper.type=PerParamClipOptimWrapper',
                 'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0',
                 'train_dataloader.persistent_workers=False',
                 'model.backbone.arch.num_layers=2', 'model.head.out_channels=64',
                 'model.loss.out_channels=64', 'env_cfg.dist_cfg.backend=gloo',
                 'custom_hooks.3.bank_dataloader.num_workers=0',
                 'custom_hooks.3.query_dataloader.num_workers=0',
                 '--probe-epochs', '1', '--probe-cfg-options',
                 'model.backbone.out_indices=[-2,-1]', 'model.backbone.frozen_stages=2',
                 'model.neck.in_channels=384', 'model.head.in_channels=384',
                 'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0',
                 'train_dataloader.persistent_workers=False',
                 'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False'])
    with open(osp.join(work, 'report', 'report.json')) as f:
        report = json.load(f)
    models = {m['name']: m for m in report['models']}
    assert list(models) == ['vit-dino', 'vit-random', 'dinovim-dino', 'dinovim-random',
                            'linearvit-dino', 'linearvit-random']
    for name in ('vit', 'dinovim', 'linearvit'):  # the random init, then the end
        with open(osp.join(work, f'train_{name}.log')) as f:
            log = f.read()
        start = re.search(r'k-NN \(k=20, T=0.07\) of teacher.backbone at iteration 0: '
                          r'top-1 ([0-9.]+) %', log)
        assert start is not None
        assert 'at iteration 3: top-1' in log  # 24 images, batches of 8
        # "random init" is the run's own start (InitialWeightsHook's init.pth):
        # the tool's k-NN of it equals the hook's at iteration 0, same images
        random = models[f'{name}-random']
        assert random['checkpoint'] == osp.join(work, f'{name}_init.pth')
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
            assert model['probe_checkpoint'] == osp.join(probe_dir, 'epoch_1.pth')
    assert {m['kind'] for m in report['models']} == {'softmax', 'ssd', 'linear'}
    assert all(m['depth'] == 2 for m in report['models'])
    assert report['meta']['num_val'] == 12
    # each teacher's paired gain over its own start
    assert [(p['model'], p['base']) for p in report['pairs']] == [
        (f'{n}-dino', f'{n}-random') for n in ('vit', 'dinovim', 'linearvit')]
    for pair in report['pairs']:
        assert pair['knn']['mean'] == pytest.approx(
            models[pair['model']]['knn']['mean'] - models[pair['base']]['knn']['mean'])
    for name in ('report.md', 'auc_vs_depth.png', 'rank_vs_depth.png',
                 'activation_maps.png'):
        assert osp.getsize(osp.join(work, 'report', name)) > 0
