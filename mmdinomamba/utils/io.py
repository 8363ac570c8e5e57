"""Atomic writes: a reader sees a file's old content or its new one, never a part.

:func:`write_atomic` writes a temporary file next to the target, fsyncs it and
renames it over the target; a failed write names the file and the free space
left. :func:`dump_atomic` (JSON or pickle) and :func:`save_atomic`
(``torch.save``) are its two common uses.
"""
import json
import os
import os.path as osp
import pickle
import shutil
import tempfile
from typing import Any, Callable

import torch

__all__ = ['dump_atomic', 'save_atomic', 'write_atomic']


def _fsync(path: str) -> None:
    """Flush a file, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_space(directory: str) -> str:
    try:
        return f'{shutil.disk_usage(directory).free / 2**20:.1f} MiB'
    except OSError:
        return 'unknown space'


def write_atomic(path: str, write: Callable[[str], None], prefix: str = '.tmp-') -> None:
    """Call ``write(temp_path)`` on a temporary file next to ``path``, then rename.

    The temporary file is fsynced before the rename and the directory after it,
    so neither a crash nor a power loss leaves a half-written file at ``path``:
    it holds the old content or the new one. The file gets the usual permissions
    (``0o666`` less the umask), not the private mode of ``mkstemp``. A failed
    write removes the temporary file and raises the same error type with a
    message that names ``path`` and the free space left on its file system (a
    full disk makes ``torch.save`` fail with "unexpected pos ...").

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
        try:
            write(tmp)
            _fsync(tmp)
        except (OSError, RuntimeError) as err:
            message = (f'writing {path} failed: {err} ({_free_space(directory)} free '
                       'on its file system; a full disk fails this way: free some '
                       'space or write elsewhere)')
            raise (OSError(err.errno, message) if isinstance(err, OSError)
                   and err.errno else type(err)(message)) from err
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        _fsync(directory)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically, newlines as given (no translation)."""

    def write(tmp: str) -> None:
        with open(tmp, 'w', newline='') as f:
            f.write(text)

    write_atomic(path, write)


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
