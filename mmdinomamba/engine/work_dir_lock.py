"""One training run per work_dir: a lock file that names the run holding it.

Two runs in one work_dir write one log and each other's checkpoints, and the
second deletes the first one's temporary checkpoint as "interrupted". So
``tools/train.py`` holds :class:`WorkDirLock` for the whole run: an exclusive
``flock`` on ``WORK_DIR/.lock``, a file that names the holder (pid, host, start
time, command). The kernel releases the lock when the process ends, however it
ends, so a lock left by a killed run (its file still names it) is stale: the next
run takes it over and logs that it did. A second run while the first is alive
fails with an error that names the lock file and its holder.
"""
import datetime
import fcntl
import json
import logging
import os
import os.path as osp
import socket
import sys
from typing import Optional

from mmengine.logging import print_log

LOCK_NAME = '.lock'


class WorkDirLockedError(RuntimeError):
    """Another live run holds the work_dir's lock."""


def _describe(holder: str) -> str:
    try:
        info = json.loads(holder)
        return (f"pid {info['pid']} on host {info['host']}, started {info['started']}: "
                f"{' '.join(info['argv'])}")
    except (ValueError, KeyError, TypeError):
        return repr(holder)


class WorkDirLock:
    """Exclusive lock on a training work_dir, for the life of this process.

    Use as a context manager (``with WorkDirLock(work_dir): ...``); on a clean exit
    the file is emptied and the lock released.

    Args:
        work_dir (str): the run's work directory (created if absent).
    """

    def __init__(self, work_dir: str):
        self.path = osp.join(work_dir, LOCK_NAME)
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`WorkDirLockedError` naming the holder."""
        os.makedirs(osp.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise WorkDirLockedError(
                f'{osp.dirname(self.path)} is in use by another training run '
                f'({_describe(holder)}; lock file {self.path}). Wait for it to end or '
                'stop it, or train into another --work-dir') from None
        stale = _read(fd)
        if stale:
            print_log(f'taking over the stale lock {self.path} of a run that is gone '
                      f'({_describe(stale)})', logger='current', level=logging.WARNING)
        me = dict(pid=os.getpid(), host=socket.gethostname(),
                  started=datetime.datetime.now().isoformat(timespec='seconds'),
                  argv=sys.argv)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the lock file (a clean end leaves nothing stale) and unlock."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> 'WorkDirLock':
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> str:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0).decode(errors='replace').strip() if size else ''
