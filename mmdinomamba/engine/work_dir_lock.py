"""One training run per folder it writes: lock files that name the run holding them.

Two runs in one work_dir write one log and each other's checkpoints, and the
second deletes the first one's temporary checkpoint as "interrupted"; two runs
whose checkpoints go to one ``checkpoint.out_dir`` folder overwrite each other's
``epoch_N.pth``. So ``tools/train.py`` holds :class:`WorkDirLock` on every folder
the run writes (:func:`~mmdinomamba.engine.run_folders`: the work dir and the
checkpoint and log ``out_dir`` folders) for the whole run: an exclusive ``flock``
on ``FOLDER/.lock``, a file that names the holder (pid, process group, host, start
time, command).

The lock belongs to the run's main process. The kernel releases it when that
process ends, however it ends; processes it forks (data workers, in the run's
process group) close their copy of the lock file as they start, and it is
closed on ``exec``, so neither keeps a killed run's lock. A lock file that names
a run that is gone, whose lock is held by no process, is stale: the next run
takes it over and logs one line that says so. A second run while the first is
alive fails with an error that names the lock file and its holder; a lock still
held after its run is gone (by a process it started some other way) fails naming
the processes that hold it.
"""
import datetime
import fcntl
import json
import logging
import os
import os.path as osp
import socket
import sys
from typing import Dict, List, Optional, Tuple

from mmengine.logging import print_log

LOCK_NAME = '.lock'
# the lock files this process holds: a forked child closes its copies
_HELD = set()


def _close_in_child() -> None:
    """In a forked child: drop the inherited copies of the held lock files.

    Closing one copy of a ``flock``ed file leaves the lock with the other copies
    (the parent's), so only the run's main process keeps it.
    """
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_close_in_child)


class WorkDirLockedError(RuntimeError):
    """Another live run holds the lock of a folder this run writes."""


def _holder(text: str) -> Optional[Dict]:
    try:
        info = json.loads(text)
    except ValueError:
        return None
    return info if isinstance(info, dict) and 'pid' in info else None


def _describe(holder: str) -> str:
    info = _holder(holder)
    if info is None:
        return repr(holder)
    try:
        group = f' (process group {info["pgid"]})' if 'pgid' in info else ''
        return (f"pid {info['pid']} on host {info['host']}{group}, started "
                f"{info['started']}: {' '.join(info['argv'])}")
    except (KeyError, TypeError):
        return repr(holder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _processes_holding(path: str) -> List[int]:
    """The pids of the processes of this host with ``path`` open (Linux's /proc;
    empty where it cannot be read)."""
    target = osp.realpath(path)
    pids = []
    try:
        entries = os.listdir('/proc')
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = osp.join('/proc', entry, 'fd')
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(osp.join(fd_dir, fd)) == target:
                    pids.append(int(entry))
                    break
            except OSError:  # closed meanwhile (e.g. the listing's own)
                continue
    return sorted(pids)


class WorkDirLock:
    """Exclusive lock on every folder a training run writes, for the life of this
    process.

    Use as a context manager (``with WorkDirLock(work_dir, out_dir): ...``); on a
    clean exit the files are emptied and the locks released. Either all the
    folders are locked or none.

    Args:
        work_dir (str): the run's work directory (created if absent).
        *folders (str): other folders the run writes (created if absent); a
            folder given twice (or the work dir again) is locked once.
    """

    def __init__(self, work_dir: str, *folders: str):
        unique: List[str] = []
        for folder in (work_dir, ) + folders:
            if osp.realpath(folder) not in [osp.realpath(f) for f in unique]:
                unique.append(folder)
        self.paths = [osp.join(folder, LOCK_NAME) for folder in unique]
        self.path = self.paths[0]
        self._fds: List[int] = []

    def acquire(self) -> None:
        """Take every lock, or raise :class:`WorkDirLockedError` naming the holder
        (and hold none)."""
        stale: Dict[str, List[str]] = {}  # a gone run's lock file text -> paths
        try:
            for path in self.paths:
                fd, holder = self._take(path)
                self._fds.append(fd)
                if holder:
                    stale.setdefault(holder, []).append(path)
        except BaseException:
            self.release()
            raise
        for holder, paths in stale.items():  # one line for each run that is gone
            print_log(f'taking over the stale lock {", ".join(paths)} of a run that is '
                      f'gone ({_describe(holder)})', logger='current',
                      level=logging.WARNING)

    def _take(self, path: str) -> Tuple[int, str]:
        """Lock ``path``: its fd and what it held before (a gone run's record, or
        '')."""
        folder = osp.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise WorkDirLockedError(_busy(path, holder)) from None
        _HELD.add(fd)
        stale = _read(fd)
        me = dict(pid=os.getpid(), pgid=os.getpgid(0), host=socket.gethostname(),
                  started=datetime.datetime.now().isoformat(timespec='seconds'),
                  argv=sys.argv)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        return fd, stale

    def release(self) -> None:
        """Empty the lock files (a clean end leaves nothing stale) and unlock."""
        while self._fds:
            fd = self._fds.pop()
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            _HELD.discard(fd)
            os.close(fd)

    def __enter__(self) -> 'WorkDirLock':
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _busy(path: str, holder: str) -> str:
    """The error for a lock file that another process holds."""
    folder = osp.dirname(path)
    info = _holder(holder)
    gone = (info is not None and info.get('host') == socket.gethostname()
            and isinstance(info.get('pid'), int) and not _alive(info['pid']))
    if not gone:
        return (f'{folder} is in use by another training run ({_describe(holder)}; '
                f'lock file {path}). Wait for it to end or stop it, or train into '
                'another --work-dir (or checkpoint out_dir)')
    pids = _processes_holding(path)
    held_by = (f'process{"es" if len(pids) > 1 else ""} '
               f'{", ".join(map(str, pids))}' if pids else 'processes of this host')
    stop = f'Stop them (kill {" ".join(map(str, pids))})' if pids else 'Stop them'
    return (f'{folder} is locked by {held_by} that outlived the run that took the '
            f'lock, which is gone ({_describe(holder)}; lock file {path}): '
            f'processes that run started still hold the file open. {stop}, or '
            'train into another --work-dir (or checkpoint out_dir)')


def _read(fd: int) -> str:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0).decode(errors='replace').strip() if size else ''
