"""Checkpoint helpers: safe resume under torch >= 2.6, and atomic writes.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine 0.10's
checkpoints hold a few of its own objects (the message hub's ``HistoryBuffer``)
and numpy values, so ``Runner(resume=True)`` fails with "Weights only load
failed". Instead of switching the safety off, :func:`allow_mmengine_checkpoint_types`
allow-lists exactly those types.
"""
import json
import os
import os.path as osp
import pickle
import tempfile
from typing import Any, Callable, List, Optional

import numpy as np
import torch


def _checkpoint_types() -> List[Any]:
    from mmengine.logging.history_buffer import HistoryBuffer
    core = np._core if hasattr(np, '_core') else np.core  # numpy 2 renamed it
    types = [HistoryBuffer, np.ndarray, np.dtype, core.multiarray._reconstruct,
             core.multiarray.scalar]
    # A HistoryBuffer pickles its `statistics_methods` as getattr(HistoryBuffer,
    # 'mean') etc. The weights-only unpickler only calls allow-listed callables, so
    # allowing getattr lets it look attributes up, not call them.
    types.append(getattr)
    # numpy scalars and their dtype classes (np.dtypes exists from numpy 1.25)
    for name in ('float64', 'float32', 'float16', 'int64', 'int32', 'bool_'):
        scalar = getattr(np, name)
        types.append(scalar)
        if hasattr(np, 'dtypes'):
            types.append(type(np.dtype(scalar)))
    return types


def allow_mmengine_checkpoint_types() -> None:
    """Allow-list mmengine's checkpoint types for ``torch.load(weights_only=True)``."""
    add = getattr(torch.serialization, 'add_safe_globals', None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(_checkpoint_types())


def _fsync(path: str) -> None:
    """Flush a file, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, write: Callable[[str], None], prefix: str = '.tmp-') -> None:
    """Call ``write(temp_path)`` on a temporary file next to ``path``, then rename.

    The temporary file is fsynced before the rename and the directory after it,
    so neither a crash nor a power loss leaves a half-written file at ``path``:
    it holds the old content or the new one. The file gets the usual permissions
    (``0o666`` less the umask), not the private mode of ``mkstemp``.

    Args:
        path (str): the file to write.
        write (callable): ``write(temp_path)`` writes the content to ``temp_path``.
        prefix (str): how the temporary file's name starts (a kill can leave it
            behind). Defaults to '.tmp-'.
    """
    directory = osp.dirname(osp.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix,
                               suffix=osp.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(directory)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def dump_atomic(obj: Any, path: str) -> None:
    """Write ``obj`` to ``path`` (JSON for ``.json``, else pickle) atomically."""

    def write(tmp: str) -> None:
        if path.endswith('.json'):
            with open(tmp, 'w') as f:
                json.dump(obj, f, indent=2, default=float)
        else:
            with open(tmp, 'wb') as f:
                pickle.dump(obj, f)

    write_atomic(path, write)


def save_atomic(state: Any, path: str) -> None:
    """``torch.save`` to ``path`` atomically (temporary file, then rename)."""
    write_atomic(path, lambda tmp: torch.save(state, tmp))


def find_resume_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint that ``--resume`` (without a path) continues from.

    Reads ``WORK_DIR/last_checkpoint``, as mmengine's auto-resume does, but fails
    clearly where mmengine would log "Auto resumed from the latest checkpoint ."
    and then fail with "FileNotFoundError:  can not be found.".

    Args:
        work_dir (str): the run's work directory.

    Returns:
        str or None: the checkpoint path, or None when the run has saved none
        (no ``last_checkpoint``: training starts from scratch).

    Raises:
        FileNotFoundError: ``last_checkpoint`` is empty, or names a file that
            does not exist; the message names both files.
    """
    pointer = osp.join(work_dir, 'last_checkpoint')
    if not osp.exists(pointer):
        return None
    with open(pointer) as f:
        path = f.read().strip()
    if not path:
        raise FileNotFoundError(
            f'{pointer} is empty: it should name the checkpoint to resume from. '
            'Pass one with --resume PATH, or delete the file to start from scratch')
    check_resume_checkpoint(path, f' (named by {pointer})')
    return path


def check_resume_checkpoint(path: str, origin: str = '') -> None:
    """Fail with a clear message if the checkpoint at ``path`` is absent or empty.

    Only local paths are checked; URLs and other backends are left to mmengine.

    Args:
        path (str): the checkpoint to resume from.
        origin (str): where the path came from, appended to the message.
            Defaults to ''.

    Raises:
        FileNotFoundError: the file does not exist, or is empty.
    """
    if '://' in path:
        return
    if not osp.isfile(path):
        raise FileNotFoundError(f'cannot resume: checkpoint {path}{origin} does not '
                                'exist')
    if osp.getsize(path) == 0:
        raise FileNotFoundError(f'cannot resume: checkpoint {path}{origin} is empty '
                                '(0 bytes; an interrupted write?)')
