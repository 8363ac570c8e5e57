"""The recipe runner (mmdinomamba/studies/comparison/recipe.py): its model table
and configs, the configs it writes for each run, its watch over training
processes, and what it prints and judges (its command line:
tests/tools/test_run_recipe.py; the end-to-end runs: tests/tools/test_run_*.py)."""
import json
import os.path as osp
import sys

import pytest
from mmengine.config import Config

from mmdinomamba.datasets.transforms.dino_multicrop import BLUR_RADIUS
from mmdinomamba.studies.comparison import recipe

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COMPARE = {m.name: m for m in recipe.COMPARE_MODELS}


def test_every_preset_names_configs_that_exist():
    for preset in recipe.PRESETS.values():
        assert preset.models
        for m in preset.models:
            assert osp.isfile(osp.join(ROOT, m.dino)) and osp.isfile(osp.join(ROOT, m.probe))
    assert list(COMPARE) == ['vit', 'dinovim', 'linearvit', 'mlla']


def test_compared_models_share_everything_but_the_backbone():
    cfgs = {name: Config.fromfile(osp.join(ROOT, m.dino)) for name, m in COMPARE.items()}
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
        'mmpretrain.VisionTransformer', 'DinoVim', 'LinearViT', 'PlainMLLA'}


@pytest.mark.parametrize('name', ['vit', 'dinovim', 'linearvit', 'mlla'])
def test_each_probe_reads_its_dino_runs_backbone(name):
    """The probe's backbone is the DINO config's, frozen, with the last 4 blocks
    read out, and its init_cfg loads that run's teacher."""
    dino = Config.fromfile(osp.join(ROOT, COMPARE[name].dino)).model.backbone
    probe_cfg = Config.fromfile(osp.join(ROOT, COMPARE[name].probe))
    probe = probe_cfg.model.backbone.to_dict()
    assert probe.pop('out_indices') == [-4, -3, -2, -1]
    assert probe.pop('frozen_stages') == 12
    init = probe.pop('init_cfg')
    assert init['type'] == 'Pretrained' and init['prefix'] == 'teacher.backbone.'
    assert init['checkpoint'] == f'work_dirs/compare/{name}/epoch_20.pth'
    source = probe.pop('feature_source', None)
    assert source == {'vit': None, 'dinovim': 'mixer', 'linearvit': 'normed',
                      'mlla': 'normed'}[name]
    dino = dino.to_dict()
    dino.pop('init_cfg', None)
    assert probe == dino
    assert probe_cfg.model.head.num_classes == 12
    assert probe_cfg.model.head.in_channels == probe_cfg.model.neck.in_channels == 4 * 192
    # ViT's intermediate [CLS] skip the final LayerNorm: the neck normalises them
    assert probe_cfg.model.neck.get('with_bn', False) == (name == 'vit')


@pytest.mark.parametrize('preset', ['demo', 'compare'])
def test_blur_is_dinos_range_scaled_to_the_crops(preset):
    cfg = Config.fromfile(osp.join(ROOT, recipe.PRESETS[preset].models[0].dino))
    crop, = [t for t in cfg.train_pipeline if t['type'] == 'DINOMultiCrop']
    # DINO's range is set for 224 px global crops; ours are 64 px
    scale = crop['global_size'] / 224
    assert crop['blur_radius'] == pytest.approx([r * scale for r in BLUR_RADIUS],
                                                abs=0.005)
    assert cfg.train_dataloader.dataset.pipeline == cfg.train_pipeline


def test_a_dino_run_config_is_on_the_data_for_its_length():
    cfg = recipe.dino_config(osp.join(ROOT, COMPARE['dinovim'].dino), '/data/here',
                             epochs=10, options=['train_dataloader.batch_size=4',
                                                 'model.head.out_channels=64'],
                             device='cpu', num_workers=0)
    hook, = [h for h in cfg.custom_hooks if h.type == 'KNNMonitorHook']
    for loader in (cfg.train_dataloader, hook.bank_dataloader, hook.query_dataloader):
        assert loader.dataset.data_root == '/data/here' and loader.num_workers == 0
    assert cfg.train_cfg.max_epochs == 10
    warmup, cosine, _ = cfg.param_scheduler
    assert warmup.end == cosine.begin == recipe.warmup_epochs(10) == 1
    assert cfg.train_dataloader.batch_size == 4 and cfg.model.head.out_channels == 64
    # AMP needs a GPU: on the CPU the same wrapper in float32
    assert cfg.optim_wrapper.type == 'PerParamClipOptimWrapper'
    on_gpu = recipe.dino_config(osp.join(ROOT, COMPARE['dinovim'].dino), '/d',
                                device='cuda')
    assert on_gpu.optim_wrapper.type == 'PerParamClipAmpOptimWrapper'
    assert on_gpu.train_cfg.max_epochs == 20  # the config's own length
    assert [recipe.warmup_epochs(e) for e in (1, 2, 19, 20, 40)] == [0, 1, 1, 2, 4]


def test_a_probe_config_reads_its_backbone_and_the_data(tmp_path):
    path = osp.join(ROOT, COMPARE['dinovim'].probe)
    cfg = recipe.probe_config(path, '/data/here', '/w/t.pth', epochs=3)
    assert cfg.model.backbone.init_cfg.checkpoint == '/w/t.pth'
    assert cfg.model.backbone.init_cfg.prefix is None
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        assert loader.dataset.data_root == '/data/here'
        assert loader.dataset.classes == '/data/here/classes.txt'
    assert cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 3
    assert cfg.default_hooks.checkpoint.interval == 3
    # a run without init.pth: the probe's backbone is the config's own init
    assert recipe.probe_config(path, '/d', None).model.backbone.init_cfg is None
    # what the runs read back is what was written
    written = recipe.write_config(cfg, str(tmp_path / 'probe.py'))
    assert Config.fromfile(written).to_dict() == {
        k: v for k, v in cfg.to_dict().items()}


def test_epochs_are_reported_once_each_when_they_end():
    records = [dict(epoch=1, loss=7.0), dict(epoch=1, loss=6.0), dict(lr=0.1),
               dict(epoch=2, loss=5.0), dict(epoch=2, accuracy=1.0)]
    assert recipe.ended_epochs(records, 0, finished=False) == [(1, 6.5)]
    assert recipe.ended_epochs(records, 1, finished=False) == []
    assert recipe.ended_epochs(records, 1, finished=True) == [(2, 5.0)]
    assert recipe.ended_epochs([], 0, finished=True) == []


class FakeRun:
    """A process in place of tools/train.py, for :func:`recipe.watch`."""

    def __init__(self, label, code, tmp_path):
        import subprocess
        import time
        self.label, self.max_epochs, self.start = label, 1, time.time()
        self.log = str(tmp_path / f'{label}.log')
        with open(self.log, 'w') as f:
            self.proc = subprocess.Popen([sys.executable, '-c', code], stdout=f,
                                         stderr=subprocess.STDOUT)

    def new_epochs(self):
        return []

    failure = recipe.TrainingRun.failure
    stop = recipe.TrainingRun.stop


@pytest.mark.slow
def test_a_training_run_starts_the_command_it_is_handed(tmp_path):
    """TrainingRun starts the caller's train command with ``CONFIG --work-dir
    DIR``, from the root and with the root on PYTHONPATH; the package names no
    script of its own."""
    config = tmp_path / 'cfg.py'
    config.write_text('train_cfg = dict(max_epochs=3)\n')
    echo = ('import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), '
            'os.environ["PYTHONPATH"].split(os.pathsep)[0], '
            'os.environ.get("CUDA_VISIBLE_DEVICES")]))')
    run = recipe.TrainingRun('echo', str(tmp_path), [sys.executable, '-c', echo],
                             str(config), str(tmp_path / 'work'),
                             str(tmp_path / 'logs' / 'echo.log'), device='cpu')
    assert run.proc.wait(timeout=60) == 0 and run.max_epochs == 3
    with open(run.log) as f:
        argv, cwd, path, visible = json.loads(f.read().strip().splitlines()[-1])
    assert argv == [str(config), '--work-dir', str(tmp_path / 'work')]
    assert (cwd, path, visible) == (str(tmp_path), str(tmp_path), '')


@pytest.mark.slow
def test_a_failed_run_stops_the_others(tmp_path):
    """--parallel: when one run fails, the recipe stops with its log and no other
    run is left going."""
    slow = FakeRun('slow', 'import time; time.sleep(60)', tmp_path)
    bad = FakeRun('bad', 'import sys; print("boom"); sys.exit(3)', tmp_path)
    with pytest.raises(recipe.RecipeError, match=r'(?s)bad: .*exit status 3.*boom'):
        recipe.watch([bad, slow], poll_s=0.1)
    assert slow.proc.poll() is not None  # stopped, not left running


def results(init_knn, teacher_knn, init_auc, teacher_auc, knn_gain, auc_gain):
    """What compare_models and paired_gains return for one teacher and its init."""
    def ci(mean, low, high):
        return dict(mean=mean, low=low, high=high, num=200)

    def model(knn, auc):
        cosine = ci(0.20, 0.18, 0.22)
        return dict(knn=ci(*knn), auc_by_method=dict(attention=[dict(auc=ci(*auc))],
                                                     cosine=[dict(auc=cosine)]))
    pair = dict(knn=ci(*knn_gain), auc=dict(attention=ci(*auc_gain)))
    return model(init_knn, init_auc), model(teacher_knn, teacher_auc), pair


def test_the_verdict_needs_a_higher_mean_on_both_measures():
    init_knn, init_auc = (0.30, 0.25, 0.35), (0.50, 0.49, 0.51)
    sure = dict(knn_gain=(0.15, 0.08, 0.22), auc_gain=(0.05, 0.04, 0.06))
    better = results(init_knn, (0.45, 0.38, 0.52), init_auc, (0.55, 0.53, 0.57), **sure)
    sentence, passed = recipe.verdict('toy', *better, num_val=200)
    assert passed and sentence.startswith('toy: on 200 held-out images')
    assert ("attention map's Binary-AUC is better than the random init's (0.550 "
            'against 0.500, paired gain +0.050 [+0.040, +0.060])') in sentence
    assert ("k-NN top-1 is better than the random init's (45.0 % against 30.0 %, "
            'paired gain +15.0 [+8.0, +22.0] points)') in sentence
    assert sentence.endswith('Its means are higher on both.')
    # a higher mean whose interval includes 0 passes the gate, and is a tie in words
    unsure = results(init_knn, (0.34, 0.28, 0.40), init_auc, (0.55, 0.53, 0.57),
                     knn_gain=(0.04, -0.02, 0.10), auc_gain=(0.05, 0.04, 0.06))
    sentence, passed = recipe.verdict('toy', *unsure, num_val=200)
    assert passed and "k-NN top-1 ties with the random init's (the interval " \
        'includes 0)' in sentence
    assert 'k-NN top-1 is better' not in sentence
    # "better" never at a gain of +0.000 whose interval includes 0
    zero = results(init_knn, (0.45, 0.38, 0.52), init_auc, (0.5001, 0.49, 0.51),
                   knn_gain=(0.15, 0.08, 0.22), auc_gain=(0.0001, -0.01, 0.01))
    sentence, _ = recipe.verdict('toy', *zero, num_val=200)
    assert "Binary-AUC ties with the random init's" in sentence
    assert "Binary-AUC is better" not in sentence
    # an interval below 0 is "worse"; a tie or a lower mean on either measure fails
    worse = results(init_knn, (0.45, 0.38, 0.52), init_auc, (0.45, 0.44, 0.46),
                    knn_gain=(0.15, 0.08, 0.22), auc_gain=(-0.05, -0.06, -0.04))
    sentence, passed = recipe.verdict('toy', *worse, num_val=200)
    assert not passed and "Binary-AUC is worse than the random init's" in sentence
    for teacher_knn, teacher_auc in ((init_knn, (0.55, 0.53, 0.57)),
                                     ((0.45, 0.38, 0.52), (0.49, 0.48, 0.50))):
        lower = results(init_knn, teacher_knn, init_auc, teacher_auc, **sure)
        sentence, passed = recipe.verdict('toy', *lower, num_val=200)
        assert not passed and sentence.endswith('Its means are not higher on both.')


@pytest.mark.parametrize('gain,word', [((0.01, 0.001, 0.02), 'better'),
                                       ((-0.01, -0.02, -0.001), 'worse'),
                                       ((0.0, -0.01, 0.01), 'tie'),
                                       ((0.01, 0.0, 0.02), 'tie')])
def test_order_words_follow_the_interval(gain, word):
    from mmdinomamba.studies.comparison.measures import order_word
    assert order_word(dict(zip(('mean', 'low', 'high'), gain))) == word


def test_side_by_side_lines():
    init, teacher, pair = results((0.30, 0.25, 0.35), (0.34, 0.28, 0.40),
                                  (0.50, 0.49, 0.51), (0.55, 0.53, 0.57),
                                  (0.04, -0.02, 0.10), (0.05, 0.04, 0.06))
    lines = recipe.side_by_side(init, teacher, pair, num_bank=64).splitlines()
    assert 'bank: 64 training images' in lines[0]
    assert '30.0 [25.0, 35.0]' in lines[0] and '34.0 [28.0, 40.0]' in lines[0]
    assert lines[0].endswith('gain   +4.0 [-2.0, +10.0]')
    assert '0.500 [0.490, 0.510]' in lines[1] and '0.550 [0.530, 0.570]' in lines[1]
    assert lines[1].endswith('gain +0.050 [+0.040, +0.060]')
    assert 'attention map' in lines[1] and 'cosine map' in lines[2]
    assert lines[2].count('0.200 [0.180, 0.220]') == 2


def test_loss_fell_compares_first_and_last_epoch():
    # a rise in between is allowed: only the ends count
    assert recipe.loss_fell('DINO', {1: 7.11, 4: 7.5, 10: 5.94}) == (
        'DINO loss: 7.11 (epoch 1) -> 5.94 (epoch 10)', True)
    for curve in ({1: 6.08, 10: 6.60}, {1: 5.0, 2: 5.0}):
        assert not recipe.loss_fell('DINO', curve)[1]
    assert recipe.loss_fell('probe', {}) == ('probe: no loss was logged', False)


SEQ256 = {m.name: m for m in recipe.SEQ256_MODELS}


def test_at_256_tokens_only_the_patching_changes():
    """Each seq256 model is its 65-token twin with 4 px patches (256 patch
    tokens), on its own data root and run length; the four share everything but
    the backbone."""
    assert list(SEQ256) == list(COMPARE)
    dicts = {}
    for name, m in SEQ256.items():
        cfg = Config.fromfile(osp.join(ROOT, m.dino))
        twin = Config.fromfile(osp.join(ROOT, COMPARE[name].dino))
        backbone = cfg.model.backbone.to_dict()
        assert (backbone['img_size'] // backbone['patch_size']) ** 2 == 256
        assert dict(backbone, patch_size=8) == twin.model.backbone.to_dict()
        d = cfg.to_dict()
        d['model'].pop('backbone')
        d.pop('filename', None)
        dicts[name] = json.dumps(d, sort_keys=True, default=str)
        assert cfg.train_pipeline == twin.train_pipeline  # same crops and blur
    assert len(set(dicts.values())) == 1


@pytest.mark.parametrize('name', ['vit', 'dinovim', 'linearvit', 'mlla'])
def test_at_256_tokens_each_probe_reads_its_dino_runs_backbone(name):
    dino = Config.fromfile(osp.join(ROOT, SEQ256[name].dino)).model.backbone.to_dict()
    probe_cfg = Config.fromfile(osp.join(ROOT, SEQ256[name].probe))
    twin = Config.fromfile(osp.join(ROOT, COMPARE[name].probe))
    probe = probe_cfg.model.backbone.to_dict()
    init = probe.pop('init_cfg')
    assert init['checkpoint'] == f'work_dirs/compare_seq256/{name}/epoch_6.pth'
    dino.pop('init_cfg', None)
    for key in ('out_indices', 'frozen_stages', 'feature_source'):
        probe.pop(key, None)
    assert probe == dino
    # the 65-token probe, but for the patching, the data and the run length
    assert dict(probe_cfg.model.backbone.to_dict(), patch_size=8,
                init_cfg=twin.model.backbone.init_cfg) == twin.model.backbone.to_dict()
    assert probe_cfg.model.neck == twin.model.neck
    assert probe_cfg.model.head == twin.model.head
