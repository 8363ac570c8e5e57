"""Checkpoint safety: what a checkpoint may hold, named refusals, atomic writes.

**No file executes code.** Every checkpoint is read with
``torch.load(weights_only=True)``: tensors, containers, numbers and strings are
built, and nothing else is built or called unless it is allow-listed. mmengine 0.10's
checkpoints also hold its message hub's ``HistoryBuffer`` and numpy values, so
:func:`allow_mmengine_checkpoint_types` (run by ``import mmdinomamba``) admits
exactly these, data only:

- numpy arrays, dtypes and scalars;
- ``HistoryBuffer``, through a stand-in whose state check admits a length, two
  numeric arrays and the built-in statistics, nothing else;
- ``builtins.getattr``, which pickle writes for ``getattr(HistoryBuffer, 'mean')``,
  through a stand-in that resolves only HistoryBuffer's statistics ``min``,
  ``max``, ``current`` and ``mean``. Plain ``getattr`` would let a file reach any
  attribute of anything it holds, ``eval`` included (``getattr.__self__`` is the
  ``builtins`` module), and store a bound ``dict.get`` as a ``HistoryBuffer``'s
  ``__reduce_ex__``, which a later ``copy.deepcopy`` (mmengine's resume does one)
  calls.

With them registered, upstream loaders (mmengine's ``load_checkpoint``,
``mmpretrain.get_model(pretrained=...)``, the inferencers) keep
``weights_only=True`` and read the checkpoints ``tools/train.py`` writes.
:func:`load_checkpoint_file` is the loader of local files for mmengine's
``CheckpointLoader`` (``--resume``, ``load_from``, ``init_cfg``, ``tools/test.py``):
a missing, empty or refused file fails naming the file, and an official
Dino-Mamba file gets the command that converts it.
:func:`load_official_checkpoint` reads the official releases, whose files also
hold an ``argparse.Namespace`` (DINO) or a yacs ``CfgNode`` (MLLA): those become
plain dicts, anything else is refused naming the file and the global.

**Atomic writes.** :func:`write_atomic` writes a temporary file next to the
target, fsyncs it and renames it over the target, so a reader sees the old
content or the new one, never a part; a failed write names the file and the free
space left.
"""
import json
import os
import os.path as osp
import pickle
import re
import shutil
import tempfile
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer

# the statistics HistoryBuffer registers for itself (its _set_default_statistics)
HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')
# what HistoryBuffer.__getstate__ returns
_HISTORY_BUFFER_STATE = {'max_length', '_log_history', '_count_history',
                         'statistics_methods'}
CONVERTER = 'tools/model_converters/dinomamba2mmdinomamba.py'


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint refused because it holds more than data; the message names the
    file and what it holds."""


def _refuse(reason: str):
    raise pickle.UnpicklingError(f'refused: {reason}')


def _short(obj: Any) -> str:
    """``repr(obj)`` cut to 80 characters; the stand-ins under their pickled names."""
    if obj is _history_buffer_statistic:
        return 'builtins.getattr'
    if obj is _CheckedHistoryBuffer:
        return 'HistoryBuffer'
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + '...'


class _CheckedHistoryBuffer(HistoryBuffer):
    """``HistoryBuffer`` as the weights-only unpickler builds it: the state is
    checked, then the object becomes a plain ``HistoryBuffer``."""

    def __setstate__(self, state):
        if not isinstance(state, dict):
            _refuse(f'a HistoryBuffer state must be a dict, got {type(state).__name__}')
        extra = sorted(map(str, set(state) - _HISTORY_BUFFER_STATE))
        if extra:
            _refuse(f'a HistoryBuffer state sets {extra}; it may only hold '
                    f'{sorted(_HISTORY_BUFFER_STATE)}')
        if not isinstance(state.get('max_length', 0), int):
            _refuse('HistoryBuffer.max_length must be an int')
        for name in ('_log_history', '_count_history'):
            value = state.get(name)
            if value is not None and not (isinstance(value, np.ndarray)
                                          and value.dtype.kind in 'biuf'):
                _refuse(f'HistoryBuffer.{name} must be a numeric numpy array, got '
                        f'{_short(value)}')
        methods = state.get('statistics_methods', {})
        if not isinstance(methods, dict):
            _refuse('HistoryBuffer statistics must be a dict')
        for name, method in methods.items():
            known = getattr(HistoryBuffer, name) if name in HISTORY_BUFFER_STATISTICS \
                else HistoryBuffer._statistics_methods.get(name)
            if method is not known:
                _refuse(f'HistoryBuffer statistic {name!r} is {_short(method)}, not '
                        "HistoryBuffer's own")
        self.__class__ = HistoryBuffer
        HistoryBuffer.__setstate__(self, state)


def _history_buffer_statistic(owner: Any, name: Any):
    """``builtins.getattr`` for the weights-only unpickler: only
    ``getattr(HistoryBuffer, s)`` for ``s`` in :data:`HISTORY_BUFFER_STATISTICS`."""
    if owner in (HistoryBuffer, _CheckedHistoryBuffer) \
            and name in HISTORY_BUFFER_STATISTICS:
        return getattr(HistoryBuffer, name)
    _refuse(f'getattr({_short(owner)}, {_short(name)}): a checkpoint may only look '
            f'up HistoryBuffer.{{{",".join(HISTORY_BUFFER_STATISTICS)}}}')


def _numpy_types() -> List[Any]:
    """numpy arrays, dtypes and scalars, under numpy 2's and numpy 1's names."""
    core = np._core if hasattr(np, '_core') else np.core  # numpy 2 renamed it
    types = [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar,
             (core.multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
             (core.multiarray.scalar, 'numpy.core.multiarray.scalar')]
    for name in ('float64', 'float32', 'float16', 'int64', 'int32', 'int16', 'int8',
                 'uint64', 'uint32', 'uint16', 'uint8', 'bool_'):
        scalar = getattr(np, name)
        types.append(scalar)
        if hasattr(np, 'dtypes'):  # the dtype classes, numpy >= 1.25
            types.append(type(np.dtype(scalar)))
    return types


def checkpoint_safe_globals() -> List[Any]:
    """The allow-list of :func:`allow_mmengine_checkpoint_types` (see the module
    docstring), as ``torch.serialization.add_safe_globals`` takes it."""
    return _numpy_types() + [
        (_CheckedHistoryBuffer, 'mmengine.logging.history_buffer.HistoryBuffer'),
        (_history_buffer_statistic, 'builtins.getattr')]


def allow_mmengine_checkpoint_types() -> None:
    """Allow-list mmengine's checkpoint types for ``torch.load(weights_only=True)``
    and make :func:`load_checkpoint_file` mmengine's loader of local files.

    Run by ``import mmdinomamba``; idempotent.
    """
    torch.serialization.add_safe_globals(checkpoint_safe_globals())
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=load_checkpoint_file,
                                     force=True)


class InertRecord(dict):
    """An object of an official checkpoint kept as plain data (e.g. the
    ``argparse.Namespace`` of the official DINO code): its attributes become the
    dict's items, also readable as attributes."""

    def __setstate__(self, state):
        if not isinstance(state, dict):
            _refuse(f'an official record must have a dict state, got '
                    f'{type(state).__name__}')
        self.update(state)

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


# the non-tensor globals official releases hold, and the data they become
OFFICIAL_STAND_INS: Dict[str, Any] = {
    'argparse.Namespace': InertRecord,  # official DINO / Dino-Mamba: `args`
    'yacs.config.CfgNode': OrderedDict,  # official MLLA (Swin-style): `config`
}
# the converter of each official format, named when such a file is loaded unconverted
OFFICIAL_CONVERTERS = {
    'argparse.Namespace': CONVERTER,
    'yacs.config.CfgNode': 'tools/model_converters/mlla2mmdinomamba.py',
}
_GLOBAL = re.compile(r'GLOBAL (\S+) (?:was not an allowed global|whose module)')


def _check_file(path: str) -> None:
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint {path} can not be found (no such file)')
    if osp.getsize(path) == 0:
        raise ValueError(f'checkpoint {path} is empty (0 bytes): an interrupted write '
                         'or download? Write or download it again')


def _refusal(path: str, message: str) -> str:
    """The message of a refused load: the file, what it holds, what to do."""
    found = _GLOBAL.search(message)
    reason = re.search(r'refused: (.*)', message)
    if found:
        what = (f'it holds {found.group(1)}, which is not data (a checkpoint may '
                'hold tensors, containers, numbers, strings, numpy values and '
                "mmengine's logging buffers)")
    elif reason:
        what = reason.group(1)
    else:
        what = message.strip().splitlines()[-1]
    text = (f'refusing to load {path}: {what}. Checkpoints are read with '
            'torch.load(weights_only=True), which never runs code from the file')
    converter = OFFICIAL_CONVERTERS.get(found.group(1)) if found else None
    if converter:
        text += (f'. This looks like an official release: convert it first:\n'
                 f'    python {converter} {path} OUT.pth\nand load OUT.pth')
    return text


def _torch_load(path: str, map_location):
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(_refusal(path, str(err))) from None
    except (EOFError, RuntimeError) as err:
        raise ValueError(f'cannot read checkpoint {path}: {err} (truncated by an '
                         'interrupted write or download, or not a torch.save file?)'
                         ) from err


def load_checkpoint_file(filename: str, map_location=None):
    """``torch.load(filename, weights_only=True)`` with errors that name the file.

    mmengine's loader of local paths once mmdinomamba is imported (see
    :func:`allow_mmengine_checkpoint_types`).

    Args:
        filename (str): a local checkpoint (``~`` is expanded).
        map_location: as for ``torch.load``. Defaults to None.

    Returns:
        The loaded object.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, truncated or not a checkpoint.
        UnsafeCheckpointError: the file holds objects that are not data; the
            message names them (and the converter of an official release).
    """
    path = osp.expanduser(filename)
    _check_file(path)
    return _torch_load(path, map_location)


def load_official_checkpoint(path: str, map_location='cpu') -> Any:
    """Read an official release (Dino-Mamba, DINO, MLLA) without unpickling objects.

    ``torch.load(weights_only=True)`` with :data:`OFFICIAL_STAND_INS`: an
    ``argparse.Namespace`` becomes an :class:`InertRecord` (a dict), a yacs
    ``CfgNode`` an ``OrderedDict``; nothing of the original class runs. Any other
    global is refused before anything is built.

    Args:
        path (str): the official file.
        map_location: as for ``torch.load``. Defaults to 'cpu'.

    Returns:
        The loaded object (for the official releases, a dict).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, truncated or not a checkpoint.
        UnsafeCheckpointError: the file holds other globals; the message names
            the file and every such global.
    """
    _check_file(path)
    stand_ins = [(obj, name) for name, obj in OFFICIAL_STAND_INS.items()]
    with torch.serialization.safe_globals(stand_ins):
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except (ValueError, pickle.UnpicklingError):
            unsafe = []  # not a zip checkpoint: the load below refuses by itself
        if unsafe:
            raise UnsafeCheckpointError(
                f'refusing to load {path}: it holds {", ".join(sorted(unsafe))}, '
                'which are not data; an official checkpoint holds tensors, '
                'containers, numbers, strings and at most '
                f'{" / ".join(OFFICIAL_STAND_INS)}')
        return _torch_load(path, map_location)


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
