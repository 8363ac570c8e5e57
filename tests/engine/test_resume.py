"""Exact resume and atomic checkpoints (ResumableCheckpointHook, tools/train.py --resume).

Every comparison is bitwise: the same float32 operations in the same order on the
CPU, so a resumed run that draws the same random numbers as the uninterrupted one
gives identical tensors, and one that draws others (drop path is on) does not.
"""
import os
import os.path as osp
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.engine import (epoch_worker_init_fn, find_resume_checkpoint,
                                get_rng_state, set_rng_state)
from mmdinomamba.utils import allow_mmengine_checkpoint_types

from tests.helpers.toy_training import (ENV, ROOT, StopAfter, StopAfterIters,
                                        tiny_dino_config, tiny_probe_config, train,
                                        train_process as run_process)


def load(path):
    # weights_only=True (torch's default): must work with the allow-list alone
    allow_mmengine_checkpoint_types()
    return torch.load(path, map_location='cpu', weights_only=True)


def assert_same(want, got, where=''):
    """Nested dicts/lists of tensors and plain values, compared exactly."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(want, got), where
    elif isinstance(want, dict):
        assert want.keys() == got.keys(), where
        for key in want:
            assert_same(want[key], got[key], f'{where}.{key}')
    elif isinstance(want, (list, tuple)):
        assert len(want) == len(got), where
        for i, (a, b) in enumerate(zip(want, got)):
            assert_same(a, b, f'{where}[{i}]')
    else:
        assert want == got, where


def assert_same_checkpoint(want_path, got_path):
    want, got = load(want_path), load(got_path)
    assert want['meta']['epoch'] == got['meta']['epoch']
    assert any(k.startswith('teacher.') for k in want['state_dict'])
    for key in ('state_dict', 'optimizer', 'param_schedulers'):
        assert_same(want[key], got[key], key)
    assert_same(want['meta']['rng_states'], got['meta']['rng_states'], 'rng_states')


def assert_same_probe_checkpoint(want_path, got_path):
    """A probe's checkpoints (no teacher), compared as assert_same_checkpoint does."""
    want, got = load(want_path), load(got_path)
    assert (want['meta']['epoch'], want['meta']['iter']) == \
        (got['meta']['epoch'], got['meta']['iter'])
    for key in ('state_dict', 'optimizer', 'param_schedulers'):
        assert_same(want[key], got[key], key)
    assert_same(want['meta']['rng_states'], got['meta']['rng_states'], 'rng_states')


def any_differs(want_path, got_path):
    want, got = load(want_path)['state_dict'], load(got_path)['state_dict']
    return any(not torch.equal(v, got[k]) for k, v in want.items())


# -- the RNG states ------------------------------------------------------------------

def test_rng_state_round_trip_restores_every_generator():
    state = get_rng_state()
    want = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    random.random(), np.random.rand(7), torch.rand(5)  # move every generator on
    set_rng_state(state)
    got = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    assert want[:3] == got[:3] and torch.equal(want[3], got[3])


def test_rng_state_refuses_incomplete_state():
    with pytest.raises(ValueError, match=r"lacks \['numpy'\]"):
        set_rng_state({k: v for k, v in get_rng_state().items() if k != 'numpy'})


def test_validation_leaves_the_training_random_stream_alone():
    """What training draws after a validation is what it would draw without one."""
    from mmdinomamba.engine import ResumableCheckpointHook
    hook = ResumableCheckpointHook(interval=1)
    state = get_rng_state()
    without_val = (random.random(), np.random.rand(), torch.rand(2))
    set_rng_state(state)
    hook.before_val(runner=None)
    random.random(), np.random.rand(9), torch.rand(7)  # validation draws
    hook.after_val(runner=None)
    with_val = (random.random(), np.random.rand(), torch.rand(2))
    assert with_val[:2] == without_val[:2] and torch.equal(with_val[2], without_val[2])


class Draws(torch.utils.data.Dataset):
    """Each sample: one draw from each of numpy, random and torch (in the worker)."""

    def __len__(self):
        return 4

    def __getitem__(self, idx):
        return torch.tensor([np.random.rand(), random.random(), torch.rand(()).item()],
                            dtype=torch.float64)


def epoch_draws(init_fn):
    """One epoch of a non-persistent one-worker loader: (4, 3) draws."""
    loader = torch.utils.data.DataLoader(Draws(), batch_size=4, num_workers=1,
                                         worker_init_fn=init_fn)
    return next(iter(loader))


@pytest.mark.slow
def test_epoch_worker_init_fn_fresh_every_epoch_and_resumable():
    from functools import partial

    from mmengine.dataset import worker_init_fn as mmengine_worker_init_fn
    fixed = partial(mmengine_worker_init_fn, num_workers=1, rank=0, seed=0)
    assert torch.equal(epoch_draws(fixed), epoch_draws(fixed))  # mmengine: a replay
    state = get_rng_state()
    first, second = epoch_draws(epoch_worker_init_fn), epoch_draws(epoch_worker_init_fn)
    assert (first != second).all()  # every generator fresh in the next epoch
    set_rng_state(state)  # what a resume does to the main process
    assert torch.equal(epoch_draws(epoch_worker_init_fn), first)


# -- in one process --------------------------------------------------------------------


@pytest.mark.slow
def test_resume_with_augmentation_in_the_main_process(toy_root, tmp_path):
    """num_workers=0: crops, flips and drop path all draw from the main process."""
    allow_mmengine_checkpoint_types()

    def config(name):
        return tiny_dino_config(toy_root, str(tmp_path / name), num_workers=0)

    train(config('full'), 'main-full')
    train(config('half'), 'main-half', hooks=[StopAfter(1)])
    train(config('resumed'), 'main-resumed',
          resume_from=str(tmp_path / 'half/epoch_1.pth'))
    assert_same_checkpoint(tmp_path / 'full/epoch_2.pth',
                           tmp_path / 'resumed/epoch_2.pth')

    # control: the same checkpoint without its RNG states resumes into another run
    stripped = load(tmp_path / 'half/epoch_1.pth')
    del stripped['meta']['rng_states']
    torch.save(stripped, tmp_path / 'stripped.pth')
    train(config('unseeded'), 'main-unseeded', resume_from=str(tmp_path / 'stripped.pth'))
    assert any_differs(tmp_path / 'full/epoch_2.pth', tmp_path / 'unseeded/epoch_2.pth')


@pytest.mark.slow
def test_two_process_ddp_resume_is_exact(toy_root, tmp_path):
    for run in ('full', 'half', 'resumed'):  # each its own pair of processes
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
               '--master_port=29533', '-m', 'tests.helpers.dino_ddp_resume_worker',
               toy_root, str(tmp_path), run]
        proc = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, (run, proc.stdout[-3000:] + proc.stderr[-3000:])
    final = tmp_path / 'full/epoch_2.pth'
    assert_same_checkpoint(final, tmp_path / 'resumed/epoch_2.pth')
    meta = load(final)['meta']
    states = meta['rng_states']
    assert len(states) == 2  # one per rank, and the ranks' generators differ
    assert not torch.equal(states[0]['torch'], states[1]['torch'])
    # the head's BatchNorm statistics differ per rank (DDP does not broadcast
    # buffers): rank 1's are saved beside rank 0's model
    assert meta['rank_buffers'][0] == {}
    assert 'head.mlp.1.running_mean' in meta['rank_buffers'][1]


# -- killed tools/train.py processes -----------------------------------------------------

def write_config(toy_root, path, max_keep_ckpts):
    """3 epochs of 4 iterations, a checkpoint every epoch, augmentation in-process."""
    cfg = tiny_dino_config(toy_root, str(path.parent), max_epochs=3, num_workers=0)
    cfg.default_hooks.checkpoint.max_keep_ckpts = max_keep_ckpts
    cfg.dump(str(path))
    return str(path)


def train_process(config, work_dir, *args, fault=None):
    return run_process(config, '--work-dir', str(work_dir), *args, fault=fault)


@pytest.fixture(scope='module')
def uninterrupted(toy_root, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('uninterrupted')
    config = write_config(toy_root, work_dir / 'cfg.py', max_keep_ckpts=3)
    proc = train_process(config, work_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work_dir / 'epoch_3.pth'


def pointer(work_dir):
    with open(work_dir / 'last_checkpoint') as f:
        return f.read()


@pytest.mark.parametrize('fault, max_keep_ckpts, returncode', [
    (('kill-after-iter', '6'), 3, -9),   # in epoch 2, between two saves
    (('raise-in-write', '2'), 2, 1),     # epoch_2.pth's write fails half-way
    (('kill-in-write', '2'), 1, -9),     # killed writing epoch_2.pth, keeping one
])
@pytest.mark.slow
def test_killed_training_resumes_to_the_uninterrupted_result(
        toy_root, tmp_path, uninterrupted, fault, max_keep_ckpts, returncode):
    config = write_config(toy_root, tmp_path / 'cfg.py', max_keep_ckpts)
    proc = train_process(config, tmp_path, fault=fault)
    assert proc.returncode == returncode, proc.stderr[-3000:]
    # what the kill left: epoch 1 complete and named, no trace of epoch 2
    assert pointer(tmp_path) == str(tmp_path / 'epoch_1.pth')
    assert not osp.exists(tmp_path / 'epoch_2.pth')
    assert load(tmp_path / 'epoch_1.pth')['meta']['epoch'] == 1
    # a SIGKILL mid-write leaves the temporary file; a raise removes it
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith('.tmp-ckpt-')]
    assert len(leftovers) == (fault[0] == 'kill-in-write')

    proc = train_process(config, tmp_path, '--resume')
    assert proc.returncode == 0, proc.stderr[-3000:]
    removed = 'a checkpoint write that was interrupted' in proc.stdout + proc.stderr
    assert removed == (fault[0] == 'kill-in-write')
    assert not [n for n in os.listdir(tmp_path) if n.startswith('.tmp-ckpt-')]
    assert_same_checkpoint(uninterrupted, tmp_path / 'epoch_3.pth')
    kept = sorted(n for n in os.listdir(tmp_path) if n.startswith('epoch_'))
    assert kept == [f'epoch_{e}.pth' for e in range(4 - max_keep_ckpts, 4)]
    # InitialWeightsHook's file stays, written once by the first (fresh) run
    assert osp.exists(tmp_path / 'init.pth')
    assert pointer(tmp_path) == str(tmp_path / 'epoch_3.pth')


# -- a broken last_checkpoint ------------------------------------------------------------

def test_find_resume_checkpoint(tmp_path):
    assert find_resume_checkpoint(str(tmp_path)) is None  # nothing saved: start afresh
    (tmp_path / 'last_checkpoint').write_text('')
    with pytest.raises(FileNotFoundError, match=r'last_checkpoint is empty'):
        find_resume_checkpoint(str(tmp_path))
    gone = tmp_path / 'epoch_4.pth'
    (tmp_path / 'last_checkpoint').write_text(str(gone) + '\n')
    with pytest.raises(FileNotFoundError, match=rf'{gone} \(named by .*last_checkpoint\) '
                       'does not exist'):
        find_resume_checkpoint(str(tmp_path))
    gone.write_bytes(b'')
    with pytest.raises(FileNotFoundError, match='is empty'):
        find_resume_checkpoint(str(tmp_path))
    gone.write_bytes(b'x')
    assert find_resume_checkpoint(str(tmp_path)) == str(gone)


@pytest.mark.parametrize('content', ['', '/nowhere/epoch_3.pth'])
def test_train_tool_names_a_broken_last_checkpoint(load_tool, toy_root, tmp_path,
                                                   content):
    (tmp_path / 'last_checkpoint').write_text(content)
    train_tool = load_tool('tools/train.py')
    config = write_config(toy_root, tmp_path / 'cfg.py', max_keep_ckpts=1)
    args = ['prog', config, '--work-dir', str(tmp_path), '--resume']
    expected = 'epoch_3.pth' if content else 'last_checkpoint is empty'
    with pytest.raises(FileNotFoundError, match=expected), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, 'argv', args)
        train_tool.main()


# -- a new best, and an iteration-based run ------------------------------------------------

@pytest.mark.slow
def test_resume_is_exact_across_a_new_best(toy_root, tmp_path):
    """Epoch 1's validation is a new best, so epoch_1.pth is saved again, during
    that validation (which flips at random): it must hold the training states of
    before the validation, what the uninterrupted run goes on with."""
    def config(name):
        return tiny_probe_config(toy_root, str(tmp_path / name), max_epochs=2)

    train(config('full'), 'best-full')
    train(config('half'), 'best-half', hooks=[StopAfter(1)])
    assert (tmp_path / 'half/best_accuracy_top1_epoch_1.pth').exists()
    best = load(tmp_path / 'half/epoch_1.pth')['message_hub']['runtime_info']
    assert best['best_ckpt'].endswith('best_accuracy_top1_epoch_1.pth')  # re-saved
    train(config('resumed'), 'best-resumed',
          resume_from=str(tmp_path / 'half/epoch_1.pth'))
    assert_same_probe_checkpoint(tmp_path / 'full/epoch_2.pth',
                                 tmp_path / 'resumed/epoch_2.pth')


@pytest.mark.slow
def test_iteration_based_resume_with_augmentation_in_the_main_process(toy_root,
                                                                     tmp_path):
    """num_workers=0 and random crops: mmengine's loop skips the 4 trained
    iterations by loading (and augmenting) their batches after the hook restored
    the generators; the hook restores them again after the skip."""
    def config(name):
        cfg = tiny_probe_config(toy_root, str(tmp_path / name), max_iters=6)
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
        cfg.default_hooks.checkpoint.save_best = None
        return cfg

    train(config('full'), 'iter-full')
    train(config('half'), 'iter-half', hooks=[StopAfterIters(4)])
    assert sorted(os.listdir(tmp_path / 'half')).count('iter_4.pth') == 1
    train(config('resumed'), 'iter-resumed', resume_from=str(tmp_path / 'half/iter_4.pth'))
    assert_same_probe_checkpoint(tmp_path / 'full/iter_6.pth',
                                 tmp_path / 'resumed/iter_6.pth')


def test_rng_state_from_a_gpu_run_restores_the_cpu_generators(monkeypatch):
    """A CUDA state on a machine without CUDA: logged, the CPU generators restored."""
    import mmdinomamba.engine.rng_state as rng
    state = dict(get_rng_state(), cuda=torch.zeros(16, dtype=torch.uint8))
    want = torch.rand(3)
    messages = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(rng, 'print_log', lambda msg, **kwargs: messages.append(msg))
    set_rng_state(state)
    assert torch.equal(torch.rand(3), want)
    assert messages == ['RNG state: it holds a CUDA generator state and CUDA is not in '
                        'use here; the CUDA generator is not restored']
