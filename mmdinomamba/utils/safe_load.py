"""Checkpoint safety: what a checkpoint may hold, and named refusals.

**No file executes code.** Every checkpoint is read with
``torch.load(weights_only=True)``: tensors, containers, numbers and strings are
built, and nothing else is built or called unless it is allow-listed. mmengine 0.10's
checkpoints also hold its message hub's ``HistoryBuffer`` and numpy values, so
:func:`allow_mmengine_checkpoint_types` (run by ``import mmdinomamba``) admits
exactly these, data only:

- numpy arrays, dtypes and scalars of plain numeric dtypes, each through a
  stand-in that checks what the file gives it: a dtype is built from its code
  (``'f8'``, ``'u4'``, ...) and its pickled state may set nothing but the byte
  order, an array's data must be exactly its shape's bytes, a scalar's its
  dtype's. numpy's own constructors are not admitted: BUILD on a genuine dtype
  sets its fields and flags, so a "float64" could hide an object field whose
  bytes become a pointer. Arrays come back as plain ``ndarray`` through
  :func:`load_checkpoint_file`, as an ``ndarray`` subclass from a bare
  ``torch.load``;
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
``weights_only=True`` and read the checkpoints ``tools/train.py`` writes. (The
config text a checkpoint stores is data to the unpickler; what reads it as
config is :mod:`mmdinomamba.utils.safe_config`.)
:func:`load_checkpoint_file` is the loader of local files for mmengine's
``CheckpointLoader`` (``--resume``, ``load_from``, ``init_cfg``, ``tools/test.py``):
a missing, empty or refused file fails naming the file, and an official
Dino-Mamba file gets the command that converts it.
:func:`load_official_checkpoint` reads the official releases, whose files also
hold an ``argparse.Namespace`` (DINO) or a yacs ``CfgNode`` (MLLA): those become
plain dicts, anything else is refused naming the file and the global.
"""
import os.path as osp
import pickle
import re
from collections import OrderedDict
from typing import Any, Dict, List

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer

__all__ = ['CONVERTER', 'InertRecord', 'OFFICIAL_CONVERTERS', 'OFFICIAL_STAND_INS',
           'UnsafeCheckpointError', 'allow_mmengine_checkpoint_types',
           'checkpoint_safe_globals', 'load_checkpoint_file', 'load_official_checkpoint']

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
        state = dict(state)
        for name in ('_log_history', '_count_history'):
            value = state.get(name)
            if value is not None and not (isinstance(value, np.ndarray)
                                          and value.dtype.kind in 'biuf'):
                _refuse(f'HistoryBuffer.{name} must be a numeric numpy array, got '
                        f'{_short(value)}')
            if value is not None:
                state[name] = _plain_numpy(value)
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


# numpy values in a checkpoint: plain numeric dtypes (no fields) in either byte order
# (what HistoryBuffer's histories and numpy scalars use); object, string, void and
# structured dtypes are never built
NUMPY_DTYPE_CODES = re.compile(r'b1|[iu][1248]|f[248]|c(8|16)')
_DTYPE_STATE_TAIL = (None, None, None, -1, -1, 0)  # no subarray, fields, flags


class _NumpyDtype:
    """``numpy.dtype`` as the weights-only unpickler builds it: a numeric dtype
    named by its code (``'f8'``, ``'u4'``, ...), whose pickled state may only set
    its byte order. A file that pickles a genuine dtype and then BUILDs fields,
    flags or sizes onto it (a "float64" whose bytes are read as an object
    pointer) is refused here, before any dtype exists.

    The genuine dtype is :attr:`resolved`; arrays and scalars take it from here.
    """

    def __init__(self, code=None, align=False, copy=True):
        if not (isinstance(code, str) and NUMPY_DTYPE_CODES.fullmatch(code)
                and align is False and copy is True):
            _refuse(f'numpy dtype {_short(code)} (align={_short(align)}): a '
                    'checkpoint may only hold numeric numpy dtypes '
                    '(b1, i1-i8, u1-u8, f2-f8, c8, c16)')
        self.code = code
        self.resolved = np.dtype(code)

    def __setstate__(self, state):
        if getattr(self, 'code', None) is None or not isinstance(state, tuple) \
                or len(state) != 8 or state[0] != 3 or state[1] not in ('<', '>', '|') \
                or state[2:] != _DTYPE_STATE_TAIL:
            _refuse(f'numpy dtype state {_short(state)}: only a byte order may be '
                    'set on a numeric dtype (no fields, sizes or flags)')
        order = state[1]
        dtype = np.dtype(self.code).newbyteorder(order) if order != '|' \
            else np.dtype(self.code)
        if dtype.__reduce__()[2] != state:
            _refuse(f'numpy dtype state {_short(state)} is not the state of '
                    f'{dtype!r}')
        self.resolved = dtype

    def __reduce__(self):  # pickles as the genuine dtype
        return self.resolved.__reduce__()


def _resolved_dtype(dtype: Any) -> np.dtype:
    if not isinstance(dtype, _NumpyDtype) or not hasattr(dtype, 'resolved'):
        _refuse(f'numpy value with dtype {_short(dtype)}: a checkpoint may only '
                'give numpy values a numeric dtype pickled as numpy.dtype')
    return dtype.resolved


class _NumpyArray(np.ndarray):
    """``numpy.ndarray`` as the weights-only unpickler builds it: only through
    :func:`_numpy_reconstruct` (never by calling the class), and its pickled state
    is checked: a shape, a :class:`_NumpyDtype`, the order flag and exactly the
    bytes that shape and dtype need. :func:`load_checkpoint_file` hands out plain
    ``ndarray`` views of these; it pickles as a plain ``ndarray``."""

    def __new__(cls, *args, **kwargs):
        _refuse('numpy.ndarray(...): a checkpoint may not construct arrays '
                'other than by numpy\'s own pickling')

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            _refuse(f'numpy array state {_short(state)}: expected numpy\'s '
                    '(1, shape, dtype, is_fortran, bytes)')
        _, shape, dtype, fortran, raw = state
        dtype = _resolved_dtype(dtype)
        if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0
                                                 for n in shape)):
            _refuse(f'numpy array shape {_short(shape)}')
        if not isinstance(fortran, bool) or not isinstance(raw, bytes) \
                or len(raw) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            _refuse(f'numpy array of shape {shape} and dtype {dtype}: its data must '
                    f'be {dtype.itemsize} bytes an element, got {_short(raw)}')
        np.ndarray.__setstate__(self, (1, shape, dtype, fortran, raw))

    def __reduce__(self):
        return np.ndarray.view(self, np.ndarray).__reduce__()


def _numpy_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` for the weights-only unpickler: only
    the empty array numpy's pickling starts from; its state comes next (BUILD)."""
    if subtype is not _NumpyArray or shape != (0, ) or typecode not in (b'b', 'b'):
        _refuse(f'_reconstruct({_short(subtype)}, {_short(shape)}, '
                f'{_short(typecode)}): only numpy\'s own array pickling')
    return np.ndarray.__new__(_NumpyArray, (0, ), np.int8)


def _numpy_scalar(dtype: Any, data: Any = None):
    """``numpy.core.multiarray.scalar`` for the weights-only unpickler: a numeric
    scalar from exactly its bytes."""
    dtype = _resolved_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        _refuse(f'numpy {dtype} scalar from {_short(data)}: expected '
                f'{dtype.itemsize} bytes')
    return np.frombuffer(data, dtype)[0]


def _plain_numpy(obj: Any) -> Any:
    """``obj`` with the numpy stand-ins inside dicts, lists and tuples replaced by
    plain arrays and dtypes (dicts and lists in place)."""
    if isinstance(obj, _NumpyArray):
        return np.ndarray.view(obj, np.ndarray)
    if isinstance(obj, _NumpyDtype):
        return obj.resolved
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (dict, list, tuple, _NumpyArray, _NumpyDtype)):
                obj[key] = _plain_numpy(value)
    elif isinstance(obj, list):
        obj[:] = [_plain_numpy(v) for v in obj]
    elif type(obj) is tuple:
        return tuple(_plain_numpy(v) for v in obj)
    return obj


def _numpy_types() -> List[Any]:
    """numpy arrays, numeric dtypes and scalars, each through its checking
    stand-in, under numpy 2's and numpy 1's names."""
    types = [(_NumpyDtype, 'numpy.dtype'), (_NumpyArray, 'numpy.ndarray')]
    for core in ('numpy._core', 'numpy.core'):  # numpy 2 renamed it
        types += [(_numpy_reconstruct, f'{core}.multiarray._reconstruct'),
                  (_numpy_scalar, f'{core}.multiarray.scalar')]
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
    ours = checkpoint_safe_globals()
    names = {name for _, name in ours}
    # ours replace whatever else was registered under the same names (torch maps
    # a name to one object, and would pick either)
    others = [g for g in torch.serialization.get_safe_globals()
              if (g[1] if isinstance(g, tuple) else f'{g.__module__}.{g.__qualname__}')
              not in names]
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(others + ours)
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
        return _plain_numpy(torch.load(path, map_location=map_location,
                                       weights_only=True))
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
