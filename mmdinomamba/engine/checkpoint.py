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
from typing import Any, Callable, List

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


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(temp_path)`` on a temporary file next to ``path``, then rename.

    A crash never leaves a half-written file at ``path``. The file gets the usual
    permissions (``0o666`` less the umask), not the private mode of ``mkstemp``.
    """
    directory = osp.dirname(osp.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix='.tmp-',
                               suffix=osp.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
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
