"""ResumableCheckpointHook's best checkpoint: atomic, and re-established on resume;
its arguments checked when it is built."""
import glob
import os
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.engine import logged_runs, read_scalars
from mmdinomamba.utils import load_checkpoint_file

from tests.helpers.toy_training import ROOT, tiny_probe_config, train_process

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
    # the validation whose best checkpoint was being written runs again
    assert 'the validation after epoch 1 (checkpoint ' in output
    assert 'did not complete in the interrupted run: running it again' in output
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


# -- a validation interrupted -----------------------------------------------------------

def validations(work_dir):
    """(step, top-1) of every validation logged in ``work_dir``, over all its runs."""
    return sorted((rec['step'], rec['accuracy/top1'])
                  for run in logged_runs(str(work_dir))
                  for rec in read_scalars(str(work_dir), run) if 'accuracy/top1' in rec)


def same_tensors(want, got):
    """Whether two (nested) state dicts hold the same tensors, bitwise."""
    if torch.is_tensor(want):
        return torch.is_tensor(got) and torch.equal(want, got)
    if isinstance(want, dict):
        return want.keys() == got.keys() and all(same_tensors(want[k], got[k])
                                                 for k in want)
    if isinstance(want, (list, tuple)):
        return len(want) == len(got) and all(map(same_tensors, want, got))
    return want == got


@pytest.mark.slow
@pytest.mark.parametrize('loop', ['epochs', 'iterations'])
def test_an_interrupted_validation_runs_again_on_resume(toy_root, tmp_path, loop):
    """Killed during the second validation (after epoch 2, or iteration 4, whose
    checkpoint is written): the resumed run validates there again before it
    trains on, and ends with every validation and the best checkpoint of an
    uninterrupted run."""
    length = dict(max_epochs=3) if loop == 'epochs' else dict(max_iters=6)
    step, last = (2, 3) if loop == 'epochs' else (4, 6)
    name = 'epoch_{}.pth' if loop == 'epochs' else 'iter_{}.pth'
    configs = {}
    for run in ('full', 'killed'):
        cfg = tiny_probe_config(toy_root, str(tmp_path / run), **length)
        configs[run] = str(tmp_path / f'{run}.py')
        cfg.dump(configs[run])
    proc = train_process(configs['full'])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    proc = train_process(configs['killed'], fault=('kill-in-val', '2'))
    assert proc.returncode == -9, (proc.stdout + proc.stderr)[-3000:]
    killed = tmp_path / 'killed'
    assert (killed / name.format(step)).exists()  # written before the validation
    assert [s for s, _ in validations(killed)] == [step // 2]  # the first only

    proc = train_process(configs['killed'], '--resume')
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    where = f'epoch {step}' if loop == 'epochs' else f'iteration {step}'
    assert (f'the validation after {where} (checkpoint {killed / name.format(step)}) '
            'did not complete in the interrupted run: running it again') in output
    full = validations(tmp_path / 'full')
    assert [s for s, _ in full] == [step // 2, step, last]
    assert validations(killed) == full  # each once, with the same scores
    bests = [sorted(osp.basename(p) for p in glob.glob(str(tmp_path / run / 'best_*')))
             for run in ('full', 'killed')]
    assert bests[0] == bests[1] and len(bests[0]) == 1
    for ckpt in (bests[0][0], name.format(last)):
        want, got = (load_checkpoint_file(str(tmp_path / run / ckpt))
                     for run in ('full', 'killed'))
        assert same_tensors(want['state_dict'], got['state_dict']), ckpt
    want, got = (load_checkpoint_file(str(tmp_path / run / name.format(last)))
                 for run in ('full', 'killed'))
    assert same_tensors(want['optimizer'], got['optimizer'])
    assert same_tensors(want['meta']['rng_states'], got['meta']['rng_states'])
    # a run that completed its validations resumes without validating again
    proc = train_process(configs['killed'], '--resume')
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert 'running it again' not in proc.stdout + proc.stderr
