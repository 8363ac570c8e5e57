"""Arguments checked against the annotations of the function that takes them.

A config value of the wrong type (``lr=abc``, ``patch_size='8'``) otherwise fails
deep inside the code that uses it (``TypeError: '<=' not supported between
instances of 'float' and 'str'``), naming neither the key nor the type it wants.
:func:`check_arg_types` reads the annotations of the function the values are
for and fails on the first value that does not match, naming the key (``where``
+ the argument's name), the type wanted and the value given.

Only simple annotations are checked: ``int``, ``float`` (an int is a float),
``bool``, ``str``, ``dict``, ``Optional``, ``Union``, ``Tuple`` and ``Sequence``
of those. Any other annotation (a tensor, a module, ``Any``) and an argument
without one pass unchecked. A bool is not an int here (``patch_size=True`` is a
mistake), and an ``int`` or ``float`` is a number, never a string.
"""
import inspect
import types
import typing
from typing import Callable, Iterable, Mapping, Optional

__all__ = ['ArgTypeError', 'check_arg_types', 'check_like', 'describe_type',
           'matches_type']

_UNCHECKED = object()
# Union[a, b] and a | b
_UNIONS = (typing.Union, getattr(types, 'UnionType', typing.Union))


class ArgTypeError(TypeError, ValueError):
    """A value of the wrong type, named by its key.

    Both a ``TypeError`` (what it is) and a ``ValueError`` (what the project's
    config checks raise), so either ``except`` catches it.
    """


PRIMITIVES = (int, float, bool, str, dict, list, tuple, type(None))


def _simple(annotation, inside: bool = False) -> bool:
    """Whether :func:`matches_type` can judge ``annotation``: a primitive
    (:data:`PRIMITIVES`), a ``Union``, ``Tuple``, ``List``, ``Sequence`` or
    ``Dict`` of them, and, next to a primitive in a ``Union``, any class
    (``Union[float, Tensor]``). A class alone (``nn.Module``: a config may give
    a dict that is built into one) is not judged."""
    if annotation in PRIMITIVES:
        return True
    if isinstance(annotation, type):
        return inside
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _UNIONS:
        return any(a in PRIMITIVES or typing.get_origin(a) is not None for a in args) \
            and all(_simple(a, inside=True) for a in args)
    if origin is dict:
        return True
    if origin in (tuple, list) or getattr(origin, '__name__', '') == 'Sequence':
        return all(_simple(a) for a in args if a is not Ellipsis)
    return False


def matches_type(value, annotation) -> bool:
    """Whether ``value`` fits ``annotation`` (a simple one: :func:`_simple`)."""
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(annotation, type):  # str, dict, a class
        return isinstance(value, annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _UNIONS:
        return any(matches_type(value, a) for a in args)
    if origin is dict:
        return isinstance(value, Mapping)
    # Tuple[...], List[...], Sequence[...]: a list or a tuple (a config gives either)
    if not isinstance(value, (list, tuple)):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:
        return len(value) == len(args) and all(
            matches_type(v, a) for v, a in zip(value, args))
    item = args[0] if args else None
    return item is None or all(matches_type(v, item) for v in value)


def describe_type(annotation) -> str:
    """``Union[int, Tuple[int, int]]`` -> ``'int or tuple of 2 int'``."""
    names = {int: 'int', float: 'number (float)', bool: 'bool (True/False)',
             str: 'str', dict: 'dict', list: 'list', tuple: 'tuple',
             type(None): 'None'}
    if annotation in names:
        return names[annotation]
    if isinstance(annotation, type):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _UNIONS:
        return ' or '.join(describe_type(a) for a in args)
    if origin is dict:
        return 'dict'
    if origin is tuple and args and args[-1] is not Ellipsis:
        kinds = {describe_type(a) for a in args}
        return (f'list of {len(args)} {kinds.pop()}' if len(kinds) == 1
                else f'list of ({", ".join(describe_type(a) for a in args)})')
    return f'list of {describe_type(args[0])}' if args else 'list'


def _hints(func: Callable) -> dict:
    try:
        return typing.get_type_hints(func)
    except Exception:  # a forward reference that does not resolve: check nothing
        return {}


def class_hints(cls: type) -> dict:
    """The annotations of the arguments of ``cls(...)``: those of its
    ``__init__`` and, for arguments it passes on (``*args, **kwargs``), those of
    its bases' (the nearest class's annotation wins)."""
    hints = {}
    for klass in reversed(cls.__mro__):
        if '__init__' in vars(klass):
            hints.update(_hints(klass.__init__))
    hints.pop('return', None)
    return hints


def check_arg_types(func: Callable, values: Mapping, where: str,
                    skip: Iterable[str] = ('self', 'init_cfg'),
                    hints: Optional[dict] = None) -> None:
    """Check ``values`` (argument name -> value) against ``func``'s annotations.

    Args:
        func (callable): the function (or class) the values are for.
        values (Mapping): argument name -> value; names ``func`` does not
            annotate pass unchecked.
        where (str): what the keys belong to, for the message: ``'DinoVim'``
            (-> ``DinoVim: patch_size ...``) or ``'model.backbone.'``
            (-> ``model.backbone.patch_size ...``).
        skip (iterable[str]): argument names never checked. Defaults to
            ``('self', 'init_cfg')`` (mmengine takes a list there too).
        hints (dict, optional): the annotations, when already read.

    Raises:
        ArgTypeError: a value that does not fit its annotation: the key, the type
            wanted and the value given (with its type).
    """
    if hints is None:
        hints = class_hints(func) if inspect.isclass(func) else _hints(func)
    skip = set(skip)
    sep = '' if where.endswith('.') else ': '
    for name, value in values.items():
        annotation = hints.get(name, _UNCHECKED)
        if name in skip or annotation is _UNCHECKED or not _simple(annotation):
            continue
        if not matches_type(value, annotation):
            raise ArgTypeError(
                f'{where}{sep}{name} must be {describe_type(annotation)}, got '
                f'{value!r} ({type(value).__name__})')


def _annotation_of(example):
    """The annotation an example value stands for: ``4`` -> ``int``, ``[2, 4]`` ->
    ``List[int]``; None for a value of another kind (checked by nothing)."""
    if isinstance(example, bool):
        return bool
    if isinstance(example, (int, float, str)):
        return type(example)
    if isinstance(example, (list, tuple)) and example:
        item = _annotation_of(example[0])
        return None if item is None else typing.List[item]
    return None


def check_like(values: Mapping, examples: Mapping, where: str) -> None:
    """Check ``values`` against the types of ``examples`` key by key (a custom
    ``arch`` dict against the presets': ``embed_dims`` an int, ``depths`` a list
    of ints, ``mlp_ratio`` a number). Keys without an example pass.

    Raises:
        ArgTypeError: as :func:`check_arg_types`.
    """
    hints = {k: _annotation_of(v) for k, v in examples.items()}
    check_arg_types(None, values, where, skip=(),
                    hints={k: v for k, v in hints.items() if v is not None})
