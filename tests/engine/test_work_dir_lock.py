"""One training run per folder it writes (WorkDirLock, run_folders, tools/train.py)."""
import fcntl
import json
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import time

import pytest
from mmengine.config import Config

import mmdinomamba.engine.work_dir_lock as lock_module
from mmdinomamba.engine import WorkDirLock, WorkDirLockedError, run_folders

from tests.helpers.toy_training import ENV, ROOT, tiny_dino_config

TAKE = ('from mmdinomamba.engine import WorkDirLock; import sys; '
        'WorkDirLock(sys.argv[1]).acquire()')


@pytest.mark.slow
def test_a_held_lock_refuses_another_process_naming_the_holder(tmp_path):
    with WorkDirLock(str(tmp_path)) as lock:
        holder = json.loads(open(lock.path).read())
        assert holder['pid'] == os.getpid() and holder['host'] == socket.gethostname()
        proc = subprocess.run([sys.executable, '-c', TAKE, str(tmp_path)], env=ENV,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f'{tmp_path} is in use by another training run (pid {os.getpid()} on ' \
        f'host {socket.gethostname()}' in proc.stderr
    assert f'lock file {tmp_path / ".lock"}' in proc.stderr
    assert open(tmp_path / '.lock').read() == ''  # released cleanly: nothing stale


def test_a_stale_lock_is_taken_over_with_a_log_line(tmp_path, monkeypatch):
    messages = []
    monkeypatch.setattr(lock_module, 'print_log',
                        lambda msg, **kwargs: messages.append(msg))
    gone = dict(pid=999999, host='elsewhere', started='2026-01-01T00:00:00',
                argv=['tools/train.py', 'cfg.py'])
    (tmp_path / '.lock').write_text(json.dumps(gone))  # a killed run's file, unlocked
    with WorkDirLock(str(tmp_path)):
        assert len(messages) == 1
        assert messages[0].startswith(f'taking over the stale lock {tmp_path / ".lock"} '
                                      'of a run that is gone (pid 999999 on host '
                                      'elsewhere')
    with WorkDirLock(str(tmp_path)):
        assert len(messages) == 1  # a clean release leaves nothing to take over


def test_a_gone_runs_locks_of_several_folders_are_taken_over_in_one_line(
        tmp_path, monkeypatch):
    messages = []
    monkeypatch.setattr(lock_module, 'print_log',
                        lambda msg, **kwargs: messages.append(msg))
    gone = dict(pid=999999, host='elsewhere', started='2026-01-01T00:00:00',
                argv=['tools/train.py', 'cfg.py'])
    for folder in ('work', 'ckpt'):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / '.lock').write_text(json.dumps(gone))
    with WorkDirLock(str(tmp_path / 'work'), str(tmp_path / 'ckpt')):
        assert messages == [
            f'taking over the stale lock {tmp_path / "work" / ".lock"}, '
            f'{tmp_path / "ckpt" / ".lock"} of a run that is gone (pid 999999 on host '
            'elsewhere, started 2026-01-01T00:00:00: tools/train.py cfg.py)']


def test_a_second_lock_in_one_process_is_refused(tmp_path):
    with WorkDirLock(str(tmp_path)):
        with pytest.raises(WorkDirLockedError, match='is in use by another training'):
            WorkDirLock(str(tmp_path)).acquire()


@pytest.mark.slow
def test_train_tool_holds_the_lock_and_a_killed_run_leaves_it_stale(toy_root,
                                                                    tmp_path):
    work = tmp_path / 'work'
    cfg = tiny_dino_config(toy_root, str(work), max_epochs=100, num_workers=0)
    config = str(tmp_path / 'cfg.py')
    cfg.dump(config)
    train = [sys.executable, osp.join(ROOT, 'tools/train.py'), config]
    first = subprocess.Popen(train, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while str(first.pid) not in _read(work / '.lock'):
            assert first.poll() is None and time.time() < deadline, 'no lock taken'
            time.sleep(0.5)
        second = subprocess.run(train, env=ENV, cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
        assert second.returncode != 0
        assert f'is in use by another training run (pid {first.pid} on host ' \
            f'{socket.gethostname()}' in second.stderr, second.stderr[-3000:]
        assert f'lock file {work / ".lock"}' in second.stderr
        assert first.poll() is None  # the live run goes on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # two epochs: the config's one warm-up epoch and one of its cosine
    third = subprocess.run(train + ['--cfg-options', 'train_cfg.max_epochs=2'],
                           env=ENV, cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    output = third.stdout + third.stderr
    assert third.returncode == 0, output[-3000:]
    assert f'taking over the stale lock {work / ".lock"} of a run that is gone (pid ' \
        f'{first.pid} on host' in output
    assert osp.exists(work / 'epoch_1.pth')


def _read(path) -> str:
    try:
        return open(path).read()
    except FileNotFoundError:
        return ''


# -- a killed run's data workers, and the folders besides the work dir --------------------

# takes the lock, starts one data worker (forked, busy in __getitem__), prints its
# pid and kills itself: the worker outlives it, as after a kill -9 of tools/train.py
ORPHAN = """
import os, signal, sys, time
import torch
from mmdinomamba.engine import WorkDirLock

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        time.sleep(300)
        return i

WorkDirLock(sys.argv[1]).acquire()
loader = iter(torch.utils.data.DataLoader(Slow(), num_workers=1))
print(loader._workers[0].pid, flush=True)
time.sleep(2)  # the worker is in __getitem__
os.kill(os.getpid(), signal.SIGKILL)
"""


def dead_pid() -> int:
    """A pid that no process of this host has."""
    pid = 999999
    while lock_module._alive(pid):
        pid -= 1
    return pid


@pytest.mark.slow
def test_orphaned_data_workers_do_not_keep_a_killed_runs_lock(tmp_path, monkeypatch):
    work = tmp_path / 'work'
    # output to a file: the orphan keeps a pipe open, and run() would wait for it
    with open(tmp_path / 'out.txt', 'w') as out:
        proc = subprocess.run([sys.executable, '-c', ORPHAN, str(work)], env=ENV,
                              stdout=out, stderr=subprocess.STDOUT, timeout=120)
    output = (tmp_path / 'out.txt').read_text()
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    worker = int(output.split()[0])
    try:
        assert lock_module._alive(worker)  # the orphan lives on
        dead = json.loads((work / '.lock').read_text())['pid']
        assert not lock_module._alive(dead)
        messages = []
        monkeypatch.setattr(lock_module, 'print_log',
                            lambda msg, **kwargs: messages.append(msg))
        with WorkDirLock(str(work)):  # taken over, not refused
            assert len(messages) == 1
            assert messages[0].startswith(
                f'taking over the stale lock {work / ".lock"} of a run that is gone '
                f'(pid {dead} on host {socket.gethostname()} (process group ')
    finally:
        os.kill(worker, signal.SIGKILL)


def test_a_lock_kept_by_processes_of_a_run_that_is_gone_names_them(tmp_path):
    """A lock file whose run is gone, still locked (by a process that inherited it
    some other way than a fork of Python's): the error names the processes that
    hold it, not the dead run."""
    gone = dead_pid()
    (tmp_path / '.lock').write_text(json.dumps(dict(
        pid=gone, pgid=gone, host=socket.gethostname(), started='2026-01-01T00:00:00',
        argv=['tools/train.py', 'cfg.py'])))
    fd = os.open(tmp_path / '.lock', os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(WorkDirLockedError) as error:
            WorkDirLock(str(tmp_path)).acquire()
    finally:
        os.close(fd)
    message = str(error.value)
    assert message.startswith(f'{tmp_path} is locked by process {os.getpid()} that '
                              'outlived the run that took the lock, which is gone '
                              f'(pid {gone} on host {socket.gethostname()}')
    assert f'stop them (kill {os.getpid()})' in message.lower()


def test_run_folders_holds_the_checkpoint_and_log_out_dir(tmp_path):
    work = tmp_path / 'a' / 'run'
    cfg = Config(dict(work_dir=str(work), default_hooks=dict(
        checkpoint=dict(type='ResumableCheckpointHook', out_dir=str(tmp_path / 'ckpt')),
        logger=dict(type='LoggerHook', out_dir=str(tmp_path / 'logs')))))
    assert run_folders(cfg) == [str(work), str(tmp_path / 'ckpt' / 'run'),
                                str(tmp_path / 'logs' / 'run')]
    cfg.default_hooks.checkpoint.out_dir = str(work)  # the work dir itself
    cfg.default_hooks.logger.out_dir = 's3://bucket/logs'  # remote: not locked
    assert run_folders(cfg) == [str(work)]
    assert run_folders(Config(dict(work_dir='rel/run'))) == [osp.abspath('rel/run')]


def test_two_runs_with_one_checkpoint_out_dir_cannot_both_lock(tmp_path):
    def folders(parent):
        return run_folders(Config(dict(
            work_dir=str(tmp_path / parent / 'run'),
            default_hooks=dict(checkpoint=dict(out_dir=str(tmp_path / 'ckpt'))))))

    shared = tmp_path / 'ckpt' / 'run'
    with WorkDirLock(*folders('a')):
        second = WorkDirLock(*folders('b'))
        with pytest.raises(WorkDirLockedError,
                           match=f'{shared} is in use by another training run'):
            second.acquire()
        assert second._fds == []  # none held: its own work dir's lock released
        with WorkDirLock(str(tmp_path / 'b' / 'run')):
            pass


@pytest.mark.slow
def test_train_tool_refuses_a_checkpoint_out_dir_in_use(toy_root, tmp_path):
    """Two runs whose work dirs share a name and whose checkpoints go to one
    out_dir would overwrite each other's epoch_N.pth: the second exits 1."""
    cfg = tiny_dino_config(toy_root, str(tmp_path / 'a' / 'run'), max_epochs=1,
                           num_workers=0)
    config = str(tmp_path / 'cfg.py')
    cfg.dump(config)
    shared = tmp_path / 'ckpt' / 'run'
    with WorkDirLock(str(tmp_path / 'a' / 'run'), str(shared)):  # the first run
        proc = subprocess.run(
            [sys.executable, osp.join(ROOT, 'tools/train.py'), config, '--work-dir',
             str(tmp_path / 'b' / 'run'), '--cfg-options',
             f'default_hooks.checkpoint.out_dir={tmp_path / "ckpt"}'],
            env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert f'WorkDirLockedError: {shared} is in use by another training run (pid ' \
        f'{os.getpid()} on host' in proc.stderr
    assert f'lock file {shared / ".lock"}' in proc.stderr
    assert not list(shared.glob('*.pth'))
