"""One training run per work_dir (WorkDirLock, tools/train.py)."""
import json
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import time

import pytest

import mmdinomamba.engine.work_dir_lock as lock_module
from mmdinomamba.engine import WorkDirLock, WorkDirLockedError

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
