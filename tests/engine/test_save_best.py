"""ResumableCheckpointHook's best checkpoint: atomic, and re-established on resume;
its arguments checked when it is built."""
import os
import os.path as osp

import pytest
from mmengine.config import Config

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.utils import load_checkpoint_file

from tests.helpers.toy_training import ROOT, train_process

PROBE = osp.join(ROOT, 'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py')
BEST = 'best_accuracy_top1_epoch_{}.pth'


def write_probe_config(toy_root, work_dir):
    """The toy probe from scratch on the 2-class toy data: one epoch, validated,
    the best checkpoint kept."""
    cfg = Config.fromfile(PROBE)
    cfg.model.head.num_classes = cfg.data_preprocessor.num_classes = 2
    cfg.model.backbone.init_cfg = None
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=toy_root,
                                   classes=osp.join(toy_root, 'classes.txt'))
        cfg[loader].num_workers = 0
    cfg.train_cfg.update(max_epochs=1, val_interval=1)
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=1,
                                        save_best='accuracy/top1')
    cfg.log_level = 'WARNING'
    path = str(work_dir / 'probe.py')
    cfg.dump(path)
    return path



def complete_best(work_dir, epoch):
    checkpoint = load_checkpoint_file(str(work_dir / BEST.format(epoch)))
    assert checkpoint['meta']['epoch'] == epoch and checkpoint['state_dict']
    return checkpoint


@pytest.mark.slow
def test_killed_during_the_last_best_write_resumes_to_a_best_checkpoint(toy_root,
                                                                         tmp_path):
    config = write_probe_config(toy_root, tmp_path)
    # writes: epoch_1.pth, then the best checkpoint of epoch 1, killed half-way
    proc = train_process(config, '--work-dir', str(tmp_path),
                         fault=('kill-in-write', '2'))
    assert proc.returncode == -9, (proc.stdout + proc.stderr)[-3000:]
    assert not [n for n in os.listdir(tmp_path) if n.startswith('best_')]
    assert [n for n in os.listdir(tmp_path) if n.startswith('.tmp-ckpt-')]

    proc = train_process(config, '--work-dir', str(tmp_path), '--resume')
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert 'no best checkpoint and did not validate: validating once' in output
    complete_best(tmp_path, 1)
    hub = load_checkpoint_file(str(tmp_path / 'epoch_1.pth'))['message_hub']
    assert hub['runtime_info']['best_ckpt'] == str(tmp_path / BEST.format(1))
    assert not [n for n in os.listdir(tmp_path) if n.startswith('.tmp-ckpt-')]


@pytest.mark.slow
def test_a_recorded_best_that_is_empty_is_replaced(toy_root, tmp_path):
    """The state mmengine's delete-then-write order leaves after a kill: the
    recorded best file has 0 bytes. The resumed run names it and writes a new one."""
    config = write_probe_config(toy_root, tmp_path)
    proc = train_process(config, '--work-dir', str(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    complete_best(tmp_path, 1)
    open(tmp_path / BEST.format(1), 'wb').close()
    proc = train_process(config, '--work-dir', str(tmp_path), '--resume',
                         '--cfg-options', 'train_cfg.max_epochs=2')
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert f'the best checkpoint {tmp_path / BEST.format(1)} of the resumed run is ' \
        'missing or empty' in output
    assert not osp.exists(tmp_path / BEST.format(1))
    complete_best(tmp_path, 2)


def test_a_typo_in_the_hook_arguments_fails_when_it_is_built():
    from mmpretrain.registry import HOOKS
    with pytest.raises(TypeError, match=r"unknown arguments \['intervall'\] "
                       r"\('intervall': did you mean 'interval'\?\)"):
        HOOKS.build(dict(type='ResumableCheckpointHook', intervall=2))
    hook = HOOKS.build(dict(type='ResumableCheckpointHook', interval=2,
                            max_keep_ckpts=1, save_best='auto'))
    assert hook.interval == 2
