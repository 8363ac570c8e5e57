"""Edits of a training config by name (mmdinomamba/engine/run_config.py).

The run length is checked where it matters: the learning rate mmengine's own
schedulers give each iteration, built as the Runner builds them, against the
same schedule written out with every begin, end and T_max.
"""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import PARAM_SCHEDULERS

from mmdinomamba.engine import (amp_twin, parse_cfg_options, set_data_root,
                                set_num_workers, set_run_length)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COMPARE_DINO = osp.join(ROOT, 'configs/compare/dino_vit-d192-l12-p8_1xb128-20e_toy-rich.py')
COMPARE_PROBE = osp.join(ROOT, 'configs/compare/'
                         'linear-probe_vit-d192-l12-p8_1xb128-30e_toy-rich.py')
TOY_DINO = osp.join(ROOT, 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py')
EPOCH_LENGTH = 3


def lrs(cfg: Config, base_lr: float = 1.0):
    """The lr of every iteration of the run, from mmengine's schedulers built as
    the Runner builds them (a missing ``end`` is the run's end)."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr, weight_decay=0.0)
    schedulers = []
    for s in cfg.param_scheduler:
        s = copy.deepcopy(s.to_dict())
        if s.get('param_name', 'lr') != 'lr':
            continue
        s.setdefault('end', cfg.train_cfg.max_epochs)
        schedulers.append(PARAM_SCHEDULERS.build(
            s, default_args=dict(optimizer=optimizer, epoch_length=EPOCH_LENGTH)))
    out = []
    for _ in range(cfg.train_cfg.max_epochs * EPOCH_LENGTH):
        out.append(optimizer.param_groups[0]['lr'])
        optimizer.step()
        for scheduler in schedulers:
            scheduler.step()
    return out


def expected_lrs(epochs: int, warmup: int, eta_min: float = 1e-6,
                 start_factor: float = 1e-4):
    """The lrs of the schedule written out: a linear warm-up over ``warmup``
    epochs, then a cosine to ``eta_min`` that ends at ``epochs`` (every begin,
    end and T_max given)."""
    schedule = [dict(type='CosineAnnealingLR', eta_min=eta_min, by_epoch=True,
                     begin=warmup, end=epochs, T_max=epochs - warmup,
                     convert_to_iter_based=True)]
    if warmup:
        schedule.insert(0, dict(type='LinearLR', start_factor=start_factor,
                                by_epoch=True, begin=0, end=warmup,
                                convert_to_iter_based=True))
    return lrs(Config(dict(param_scheduler=schedule,
                           train_cfg=dict(max_epochs=epochs))))


@pytest.mark.parametrize('epochs,warmup', [(7, 1), (40, 4), (3, 2)])
def test_the_run_length_sets_every_schedule(epochs, warmup):
    cfg = set_run_length(Config.fromfile(COMPARE_DINO), epochs, warmup)
    assert cfg.train_cfg.max_epochs == epochs
    got = lrs(cfg)
    assert got == expected_lrs(epochs, warmup)
    assert got[0] == pytest.approx(1e-4)  # the warm-up's start
    assert got[warmup * EPOCH_LENGTH] == pytest.approx(1.0)  # the cosine's
    # the weight decay's cosine spans the whole run
    decay, = [s for s in cfg.param_scheduler if s.get('param_name') == 'weight_decay']
    assert decay.begin == 0 and decay.get('end', epochs) == epochs


def test_the_configured_warmup_is_kept_and_zero_removes_it():
    cfg = set_run_length(Config.fromfile(COMPARE_DINO), 30)
    assert lrs(cfg) == expected_lrs(30, 2)
    cfg = set_run_length(Config.fromfile(COMPARE_DINO), 5, warmup_epochs=0)
    assert [s.type for s in cfg.param_scheduler] == [
        'CosineAnnealingLR', 'CosineAnnealingParamScheduler']
    assert lrs(cfg) == expected_lrs(5, 0)


def test_explicit_ends_follow_the_run():
    """A schedule written with `end` and `T_max` (the ImageNet recipe's) is scaled
    the same way as one without."""
    cfg = Config.fromfile(COMPARE_DINO)
    for s in cfg.param_scheduler:
        if s.type != 'LinearLR':
            s.end = 20
        if s.type == 'CosineAnnealingLR':
            s.T_max = 18
    set_run_length(cfg, 11, 3)
    assert lrs(cfg) == expected_lrs(11, 3)


def test_the_one_validation_and_checkpoint_stay_at_the_end():
    cfg = set_run_length(Config.fromfile(COMPARE_PROBE), 4)
    assert cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 4
    assert cfg.default_hooks.checkpoint.interval == 4
    # a cosine to 0 over the 4 epochs, written out
    written = [dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=4, T_max=4)]
    assert lrs(cfg) == lrs(Config(dict(param_scheduler=written,
                                       train_cfg=dict(max_epochs=4))))
    # an interval that was not the run's length stays
    cfg = set_run_length(Config.fromfile(TOY_DINO), 3, 1)
    assert cfg.default_hooks.checkpoint.interval == 5


@pytest.mark.parametrize('epochs,warmup,match', [
    (0, None, 'max_epochs must be an int >= 1'),
    (2.5, None, 'max_epochs must be an int >= 1'),
    (3, 3, r'warm-up \(3 epochs\) must be shorter than the run \(3 epochs\)'),
])
def test_bad_lengths_are_named(epochs, warmup, match):
    with pytest.raises(ValueError, match=match):
        set_run_length(Config.fromfile(COMPARE_DINO), epochs, warmup)


def test_a_warmup_needs_a_schedule_with_one_and_epochs_not_iterations():
    with pytest.raises(ValueError, match='has no warm-up'):
        set_run_length(Config.fromfile(COMPARE_PROBE), 5, warmup_epochs=1)
    cfg = Config.fromfile(COMPARE_PROBE)
    cfg.param_scheduler[0].by_epoch = False
    with pytest.raises(ValueError, match='counts iterations'):
        set_run_length(cfg, 5)
    cfg = Config(dict(train_cfg=dict(type='IterBasedTrainLoop', max_iters=10)))
    with pytest.raises(ValueError, match='epoch-based'):
        set_run_length(cfg, 5)


def test_every_dataset_reads_the_data_root():
    cfg = set_data_root(Config.fromfile(COMPARE_DINO), '/data/here')
    hook, = [h for h in cfg.custom_hooks if h.type == 'KNNMonitorHook']
    datasets = [cfg.train_dataloader.dataset, hook.bank_dataloader.dataset,
                hook.query_dataloader.dataset]
    assert [d.data_root for d in datasets] == ['/data/here'] * 3
    assert cfg.data_root == '/data/here'
    probe = set_data_root(Config.fromfile(COMPARE_PROBE), '/data/here')
    for loader in (probe.train_dataloader, probe.val_dataloader, probe.test_dataloader):
        assert loader.dataset.data_root == '/data/here'
        assert loader.dataset.classes == '/data/here/classes.txt'
    with pytest.raises(ValueError, match='no dataset with a data_root'):
        set_data_root(Config(dict(model=dict(type='X'))), '/d')


def test_every_loader_gets_the_workers():
    cfg = set_num_workers(Config.fromfile(COMPARE_DINO), 0)
    hook, = [h for h in cfg.custom_hooks if h.type == 'KNNMonitorHook']
    for loader in (cfg.train_dataloader, hook.bank_dataloader, hook.query_dataloader):
        assert loader.num_workers == 0
        assert not loader.get('persistent_workers', False)
    with pytest.raises(ValueError, match='num_workers'):
        set_num_workers(cfg, -1)


def test_amp_twins_and_options():
    assert amp_twin('PerParamClipOptimWrapper', amp=True) == 'PerParamClipAmpOptimWrapper'
    assert amp_twin('PerParamClipAmpOptimWrapper', amp=False) == 'PerParamClipOptimWrapper'
    assert amp_twin('AmpOptimWrapper', amp=False) == 'OptimWrapper'
    assert amp_twin('OptimWrapper', amp=False) == 'OptimWrapper'
    assert parse_cfg_options(['a.b=1', 'c=[-2,-1]', 'd=x']) == {
        'a.b': 1, 'c': [-2, -1], 'd': 'x'}
    with pytest.raises(ValueError, match='KEY=VALUE'):
        parse_cfg_options(['a.b'])


def test_the_work_dir_is_the_command_lines_then_the_configs_then_by_name():
    from mmdinomamba.engine import set_work_dir
    assert set_work_dir(Config(dict(work_dir='/cfg')), '/cli', 'a/b.py') == '/cli'
    assert set_work_dir(Config(dict(work_dir='/cfg')), None, 'a/b.py') == '/cfg'
    cfg = Config(dict())
    assert set_work_dir(cfg, None, 'configs/x/dino_toy.py') == \
        osp.join('./work_dirs', 'dino_toy')
    assert cfg.work_dir == osp.join('./work_dirs', 'dino_toy')


@pytest.mark.parametrize('tool', ['tools/train.py', 'tools/test.py'])
def test_the_tools_share_their_run_options(tool, load_tool, monkeypatch):
    import os
    import sys

    positional = ['cfg.py'] if tool.endswith('train.py') else ['cfg.py', 'ckpt.pth']
    module = load_tool(tool)
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    monkeypatch.setattr(sys, 'argv', [tool, *positional, '--cfg-options', 'a.b=1',
                                      'c=[1,2]', '--no-strict', '--launcher',
                                      'pytorch', '--local-rank', '3'])
    args = module.parse_args()
    assert args.cfg_options == {'a.b': 1, 'c': [1, 2]} and args.no_strict
    assert args.launcher == 'pytorch' and os.environ['LOCAL_RANK'] == '3'
    monkeypatch.setenv('LOCAL_RANK', '1')  # the launcher's wins
    module.parse_args()
    assert os.environ['LOCAL_RANK'] == '1'
    monkeypatch.setattr(sys, 'argv', [tool, *positional, '--launcher', 'ray'])
    with pytest.raises(SystemExit):
        module.parse_args()
