"""A config stored in a checkpoint, read as data: nothing in it runs.

mmengine's runner stores its config in every checkpoint as Python source
(``message_hub['runtime_info']['cfg']``, older files ``meta['cfg']``), and
mmengine's ``BaseInferencer`` (mmdet's ``DetInferencer``, mmseg's
``MMSegInferencer``) given ``model=None, weights=FILE`` rebuilds the model from
that text with ``Config.fromstring``, which executes it; ``Runner.resume`` does
the same with ``meta['config']`` (mmcv's older key). The checkpoint itself holds
only strings, so ``torch.load(weights_only=True)`` admits such a file, and its
config then runs whatever code it holds.

:func:`config_from_text` reads the text a config dump writes (``name = value``
lines of strings, numbers, booleans, None, lists, tuples, dicts and ``dict(...)``)
without evaluating it, and refuses anything else with
:class:`UnsafeConfigError`, naming the file, the line and the fix.
:func:`read_checkpoint_configs_as_data` (run by ``import mmdinomamba``) makes
those mmengine APIs read a checkpoint's config through it.
"""
import ast
import functools
from typing import Any, Mapping

from mmengine.config import Config

__all__ = ['UnsafeConfigError', 'checkpoint_config', 'config_from_text',
           'read_checkpoint_configs_as_data']


class UnsafeConfigError(ValueError):
    """A config text refused because it is code, not data; the message names the
    source, the line and the fix."""


def _refuse(source: str, node: ast.AST, what: str):
    line = getattr(node, 'lineno', '?')
    raise UnsafeConfigError(
        f'refusing to read the config in {source}: line {line}, {what}. A config '
        'stored in a checkpoint is read as data (name = value of strings, numbers, '
        'booleans, None, lists, tuples and dicts), never run; pass the config file '
        'instead (e.g. DetInferencer(model=CONFIG, weights=CHECKPOINT))')


def _code(node: ast.AST) -> str:
    text = ast.unparse(node)
    return repr(text if len(text) <= 60 else text[:57] + '...')


def _value(node: ast.AST, source: str) -> Any:
    """The value of a data-only expression; anything else is refused."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float, complex):
        value = node.operand.value
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [_value(item, source) for item in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(item, source) for item in node.elts)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            _refuse(source, node, f'{_code(node)} unpacks a mapping (**)')
        out = {}
        for key, value in zip(node.keys, node.values):
            key = _value(key, source)
            if not isinstance(key, (str, int, float, bool, type(None), tuple)):
                _refuse(source, node, f'dict key {key!r} is not a constant')
            out[key] = _value(value, source)
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == 'dict' and not node.args \
            and all(keyword.arg is not None for keyword in node.keywords):
        return {keyword.arg: _value(keyword.value, source)
                for keyword in node.keywords}
    _refuse(source, node, f'{_code(node)} is code, not data')


def config_from_text(text: str, source: str = 'the config text') -> Config:
    """A :class:`Config` from the text of a config dump, without running it.

    Args:
        text (str): ``name = value`` lines (``Config.pretty_text``).
        source (str): where the text comes from, for messages (the file).

    Returns:
        Config: the names and their values; ``custom_imports`` is kept as data
        (nothing is imported).

    Raises:
        UnsafeConfigError: the text is not valid Python, or holds anything but
            assignments of data to names (calls other than ``dict(...)``,
            names, attributes, imports, operators, comprehensions, ``_base_``).
    """
    if not isinstance(text, str):
        raise UnsafeConfigError(f'the config in {source} is a '
                                f'{type(text).__name__}, not text')
    try:
        module = ast.parse(text, filename=source)
    except SyntaxError as err:
        raise UnsafeConfigError(f'the config in {source} is not valid Python '
                                f'(line {err.lineno}: {err.msg})') from None
    cfg = {}
    for statement in module.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            _refuse(source, statement, f'{_code(statement)} is not `name = value`')
        name = statement.targets[0].id
        if name == '_base_':
            _refuse(source, statement, '`_base_` names other files; a stored '
                    'config must be complete')
        cfg[name] = _value(statement.value, source)
    return Config(cfg, cfg_text=text)


def checkpoint_config(checkpoint: Mapping, source: str = 'the checkpoint') -> Config:
    """The config a checkpoint stores, where mmengine's inferencers look for it
    (``message_hub['runtime_info']['cfg']``, else ``meta['cfg']``), read by
    :func:`config_from_text`.

    Raises:
        ValueError: the checkpoint stores no config.
        UnsafeConfigError: the stored config is code, not data.
    """
    text = None
    if isinstance(checkpoint, Mapping):
        hub = checkpoint.get('message_hub')
        info = hub.get('runtime_info') if isinstance(hub, Mapping) else None
        meta = checkpoint.get('meta')
        if isinstance(info, Mapping) and 'cfg' in info:
            text = info['cfg']
        elif isinstance(meta, Mapping) and 'cfg' in meta:
            text = meta['cfg']
    if text is None:
        raise ValueError(f'{source} stores no config (neither message_hub.'
                         "runtime_info['cfg'] nor meta['cfg']): pass the config "
                         'file as `model`')
    return config_from_text(text, source)


def _resume_config_as_data(checkpoint: Any, source: str) -> None:
    """Replace ``meta['config']`` of a checkpoint (which mmengine's
    ``Runner.resume`` runs through ``Config.fromstring``, to read ``gpu_ids``)
    by the one line ``gpu_ids = ...`` of its data; code is refused."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
    if isinstance(meta, dict) and 'config' in meta:
        cfg = config_from_text(meta['config'], f"{source} (meta['config'])")
        meta['config'] = f"gpu_ids = {cfg.get('gpu_ids')!r}"


def _guard_resume(runner_cls) -> None:
    upstream = runner_cls.load_checkpoint
    if getattr(upstream, 'reads_config_as_data', False):
        return

    @functools.wraps(upstream)
    def load_checkpoint(self, filename, *args, **kwargs):
        checkpoint = upstream(self, filename, *args, **kwargs)
        _resume_config_as_data(checkpoint, str(filename))
        return checkpoint

    load_checkpoint.reads_config_as_data = True
    runner_cls.load_checkpoint = load_checkpoint


def read_checkpoint_configs_as_data() -> None:
    """Make the mmengine APIs that evaluate a config stored in a checkpoint read
    it as data:

    - ``BaseInferencer`` (mmdet's ``DetInferencer``, mmseg's
      ``MMSegInferencer``) with ``model=None, weights=FILE`` reads the config
      with :func:`checkpoint_config` instead of ``Config.fromstring``;
    - ``Runner.resume`` (and ``FlexibleRunner``'s) evaluates ``meta['config']``
      for its ``gpu_ids``: the loaded checkpoint's text is read as data first
      and replaced by that one line.

    Code in either is refused with :class:`UnsafeConfigError`. Run by
    ``import mmdinomamba``; idempotent.
    """
    from mmengine.runner import Runner
    _guard_resume(Runner)
    try:
        from mmengine.runner._flexible_runner import FlexibleRunner
        _guard_resume(FlexibleRunner)
    except ImportError:  # older mmengine
        pass
    from mmengine.infer import BaseInferencer
    upstream = BaseInferencer._init_model
    if getattr(upstream, 'reads_config_as_data', False):
        return

    @functools.wraps(upstream)
    def _init_model(self, cfg, weights, device='cpu'):
        if not cfg and weights is not None:
            from mmengine.runner.checkpoint import _load_checkpoint
            checkpoint = _load_checkpoint(weights, map_location='cpu')
            # in place: the inferencer builds its pipeline from the same object
            cfg.update(checkpoint_config(checkpoint, str(weights))._cfg_dict)
        return upstream(self, cfg, weights, device)

    _init_model.reads_config_as_data = True
    BaseInferencer._init_model = _init_model
