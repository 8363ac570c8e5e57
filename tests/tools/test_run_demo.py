"""The demo's checks, on made-up logs (the demo itself takes minutes: README)."""
import pytest


@pytest.fixture(scope='module')
def demo(load_tool):
    return load_tool('tools/run_demo.py')


def test_epoch_losses_average_each_epoch(demo):
    records = [dict(epoch=1, loss=7.0), dict(epoch=1, loss=6.0), dict(lr=0.1),
               dict(epoch=2, loss=5.0), dict(epoch=2, accuracy=1.0)]
    assert demo.epoch_losses(records) == {1: 6.5, 2: 5.0}


def test_loss_fell_compares_first_and_last_epoch(demo):
    # a rise in between is allowed: only the ends count
    assert demo.loss_fell('DINO', {1: 7.11, 4: 7.5, 10: 5.94}) == \
        'DINO loss: 7.11 (epoch 1) -> 5.94 (epoch 10)'
    for curve in ({1: 6.08, 10: 6.60}, {1: 5.0, 2: 5.0}):
        with pytest.raises(SystemExit, match='DINO loss did not decrease'):
            demo.loss_fell('DINO', curve)
    with pytest.raises(SystemExit, match='no probe loss was logged'):
        demo.loss_fell('probe', {})


def test_the_verdict_needs_a_higher_mean_on_both_measures(demo):
    from mmdinomamba.evaluation import BootstrapCI
    cosine = BootstrapCI(0.20, 0.18, 0.22, 200)  # reported, not judged
    random_init = dict(knn=BootstrapCI(0.30, 0.25, 0.35, 200),
                       auc=BootstrapCI(0.50, 0.49, 0.51, 200), auc_cosine=cosine,
                       num_bank=64, num_val=200)
    sure = dict(knn=BootstrapCI(0.15, 0.08, 0.22, 200),
                auc=BootstrapCI(0.05, 0.04, 0.06, 200))
    better = dict(knn=BootstrapCI(0.45, 0.38, 0.52, 200),
                  auc=BootstrapCI(0.55, 0.53, 0.57, 200), auc_cosine=cosine,
                  num_bank=64, num_val=200, gain=sure)
    unsure = dict(better, knn=BootstrapCI(0.34, 0.28, 0.40, 200),
                  gain=dict(sure, knn=BootstrapCI(0.04, -0.02, 0.10, 200)))
    assert demo.verdict(random_init, better) == (
        'DINO teacher k-NN: beats random init (gain interval above 0); Binary-AUC '
        '(attention map): beats random init (gain interval above 0)', True)
    sentence, passed = demo.verdict(random_init, unsure)
    assert passed and 'k-NN: beats random init (gain interval includes 0)' in sentence
    # a tie or a lower mean on either measure fails the demo; the cosine map's
    # AUC is not judged
    for worse in (dict(better, knn=random_init['knn']),
                  dict(better, auc=BootstrapCI(0.49, 0.48, 0.50, 200)),
                  dict(random_init, gain=sure)):
        sentence, passed = demo.verdict(random_init, worse)
        assert not passed and 'does not beat random init' in sentence
    assert demo.verdict(random_init, dict(better, auc_cosine=BootstrapCI(
        0.1, 0.0, 0.2, 200)))[1]
    # the demo's last step prints the verdict and fails on it
    falling = {1: 7.0, 10: 6.5}
    demo.final_checks(falling, falling, 1024, random_init, unsure)
    with pytest.raises(SystemExit, match='does not beat its random init'):
        demo.final_checks(falling, falling, 1024, random_init,
                          dict(random_init, gain=sure))
    lines = demo.side_by_side(random_init, unsure).splitlines()
    assert '30.0 [25.0, 35.0]' in lines[0] and '34.0 [28.0, 40.0]' in lines[0]
    assert lines[0].endswith('gain   +4.0 [-2.0, +10.0]')
    assert '0.500 [0.490, 0.510]' in lines[1] and '0.550 [0.530, 0.570]' in lines[1]
    assert lines[1].endswith('gain +0.050 [+0.040, +0.060]')
    assert 'attention map' in lines[1] and 'cosine map' in lines[2]
    assert lines[2].count('0.200 [0.180, 0.220]') == 2


def test_held_out_measures_on_a_tiny_toy_set(demo, tmp_path):
    """Step 5 on a few images: the k-NN and AUC it reports are the comparison
    library's (tested against brute force and sklearn there)."""
    import os.path as osp

    import torch
    from mmdinomamba.analysis.comparison import (ModelSpec, knn_hits, load_model,
                                                 load_split, measure_backbone)
    from mmdinomamba.datasets import make_toy_dataset
    root = str(tmp_path / 'toy')
    make_toy_dataset(root, num_classes=2, train_per_class=6, val_per_class=3, size=64,
                     formats=['imagenet'])
    config = osp.join(demo.ROOT, demo.DINO_CONFIG)
    teacher = str(tmp_path / 'teacher.pth')
    init = str(tmp_path / 'init.pth')
    torch.save(load_model(ModelSpec('t', config, None), seed=1).state_dict(), teacher)
    torch.save(load_model(ModelSpec('i', config, None), seed=2).state_dict(), init)
    random_init, dino = demo.held_out_measures(demo.DINO_CONFIG, teacher, root, init)
    bank = load_split(root, 'meta/train.txt', 'train', 64)
    val = load_split(root, 'meta/val.txt', 'val', 64, mask_prefix='masks/val')
    for got, checkpoint in ((random_init, init), (dino, teacher)):
        assert (got['num_val'], got['num_bank']) == (6, 12)
        model = load_model(ModelSpec('x', config, checkpoint))
        a = measure_backbone(model, bank, layers=[-1], with_maps=False)
        b = measure_backbone(model, val, layers=[-1], with_maps=False)
        hits = knn_hits(a, bank.labels, b, val.labels, next(iter(b.readouts)))
        assert got['knn'].mean == pytest.approx(hits.mean())
        # the headline AUC is the attention map's, the other the cosine map's
        c = measure_backbone(model, val, layers=[-1],
                             map_methods=('attention', 'cosine')).aucs
        for key, method in (('auc', 'attention'), ('auc_cosine', 'cosine')):
            per_image = next(iter(c[method].values()))[:, :-1].mean(axis=1)
            assert got[key].mean == pytest.approx(per_image.mean())
    # the teacher's gains are paired differences of those per-image values
    for key in ('knn', 'auc'):
        assert dino['gain'][key].mean == pytest.approx(
            dino[key].mean - random_init[key].mean)
        assert dino['gain'][key].num == 6


def test_cfg_options_reach_the_dino_run(demo, tmp_path, monkeypatch):
    """``--cfg-options`` go to the DINO step's tools/train.py, after the data root."""
    calls = []

    class Stop(Exception):
        pass

    def run_step(name, argv, work_dir):
        calls.append((name, argv))
        raise Stop

    monkeypatch.setattr(demo, 'run_step', run_step)
    with pytest.raises(Stop):
        demo.main(['--data-root', str(tmp_path / 'toy'), '--work-dir',
                   str(tmp_path / 'demo'), '--cfg-options', 'randomness.seed=1',
                   'train_cfg.max_epochs=2'])
    (name, argv), = calls
    assert name == 'dino' and argv[1:3] == ['tools/train.py', demo.DINO_CONFIG]
    options = argv[argv.index('--cfg-options') + 1:]
    assert options == [f'train_dataloader.dataset.data_root={tmp_path / "toy"}',
                       'randomness.seed=1', 'train_cfg.max_epochs=2']
