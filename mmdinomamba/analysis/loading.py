"""The one way the tools build a model from a config and load a checkpoint.

:func:`load_backbone` builds the config's model through the registry (in the
config's ``default_scope``, mmpretrain's by default) and loads a checkpoint with
:func:`mmdinomamba.models.checkpoint.load_backbone_checkpoint`: the backbone's
keys are found under a prefix (a DINO checkpoint's teacher first), every missing
and unexpected key is reported, and a checkpoint that does not cover the
backbone fails unless ``strict=False``.
"""
import logging
from typing import Optional, Union

import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.logging import MMLogger, print_log

from mmdinomamba.utils import allow_mmengine_checkpoint_types
from mmdinomamba.models.checkpoint import load_backbone_checkpoint

PARTS = ('backbone', 'model')

__all__ = ['PARTS', 'backbone_config', 'build_model', 'initialise_weights',
           'load_backbone', 'load_config']


def load_config(config: Union[str, Config, dict],
                cfg_options: Optional[dict] = None) -> Config:
    """A :class:`Config` from a file, a Config, or a model config dict.

    A dict with a ``type`` (and no ``model``) is taken as the model config itself.
    """
    if isinstance(config, str):
        cfg = Config.fromfile(config)
    elif isinstance(config, Config):
        cfg = config
    elif isinstance(config, dict):
        cfg = Config(dict(model=config) if 'type' in config and 'model' not in config
                     else config)
    else:
        raise ValueError(f'config must be a path, a Config or a dict, got '
                         f'{type(config).__name__}')
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def _plain(cfg) -> dict:
    return cfg.to_dict() if isinstance(cfg, ConfigDict) else dict(cfg)


def backbone_config(config: Union[str, Config, dict]) -> dict:
    """The backbone part of a config: ``model.backbone``, or ``model`` itself.

    Args:
        config (str | Config | dict): a config file, a loaded config or a model
            config.

    Returns:
        dict: the backbone config (with ``type``).
    """
    cfg = load_config(config)
    model = cfg.get('model')
    if not isinstance(model, dict):
        raise ValueError(f'{getattr(cfg, "filename", None) or "the config"}: the '
                         'config has no `model` dict')
    backbone = model.get('backbone', model)
    if not isinstance(backbone, dict) or 'type' not in backbone:
        raise ValueError('the config\'s `model` (or `model.backbone`) must be a dict '
                         f'with a `type`, got {backbone!r}')
    return _plain(backbone)


def build_model(model_cfg: dict, default_scope: str = 'mmpretrain') -> nn.Module:
    """Build a model config through the registry of ``default_scope``.

    Raises:
        ImportError: the scope's package (e.g. mmpretrain) is not installed.
    """
    import mmdinomamba  # noqa: F401  registers our classes
    from mmengine.registry import MODELS, init_default_scope
    try:
        __import__(f'{default_scope}.registry')
    except ImportError as err:
        raise ImportError(f'building {model_cfg.get("type")!r} needs {default_scope} '
                          f'(the config\'s default_scope): {err}') from err
    init_default_scope(default_scope)
    return MODELS.build(_plain(model_cfg))


def initialise_weights(model: nn.Module) -> None:
    """``model.init_weights()`` without mmengine's per-parameter INFO dump."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)


def load_backbone(config: Union[str, Config, dict],
                  checkpoint: Optional[str] = None,
                  prefix: Optional[str] = None,
                  strict: bool = True,
                  part: str = 'backbone',
                  cfg_options: Optional[dict] = None) -> nn.Module:
    """Build a config's backbone (or whole model) and load a checkpoint into it.

    Args:
        config (str | Config | dict): a config file, a loaded config, or a model
            config dict.
        checkpoint (str, optional): checkpoint file or URL; None = the model's own
            initialisation (``init_weights``, random unless its ``init_cfg``
            says otherwise).
        prefix (str, optional): key prefix of the backbone in the checkpoint; None
            to find it (:data:`mmdinomamba.models.checkpoint.BACKBONE_PREFIXES`).
        strict (bool): fail when the checkpoint does not cover the backbone or has
            unexpected backbone keys (True), or only warn. Defaults to True.
        part (str): 'backbone' builds ``model.backbone`` (or ``model`` when it is
            itself a backbone); 'model' builds the whole ``model`` and loads the
            checkpoint into its ``backbone``. Defaults to 'backbone'.
        cfg_options (dict, optional): overrides merged into the config.

    Returns:
        nn.Module: the built model, on the CPU, in training mode as built. The
        config's default scope stays set (as mmengine's Runner leaves it), so
        its datasets and transforms build in the same scope.
    """
    if part not in PARTS:
        raise ValueError(f'unknown part {part!r}; choose one of {PARTS}')
    cfg = load_config(config, cfg_options)
    model_cfg = backbone_config(cfg) if part == 'backbone' else cfg.get('model')
    if not isinstance(model_cfg, dict) or 'type' not in model_cfg:
        raise ValueError(f'the config has no `model` dict with a `type`, got '
                         f'{model_cfg!r}')
    model = build_model(model_cfg, cfg.get('default_scope') or 'mmpretrain')
    if checkpoint is None:
        initialise_weights(model)
        print_log(f'{type(model).__name__}: no checkpoint, weights from '
                  'init_weights', logger='current')
        return model
    target = getattr(model, 'backbone', model) if part == 'model' else model
    if prefix is None and part == 'model':
        prefix = getattr(model, 'weights_prefix', None)
    allow_mmengine_checkpoint_types()  # mmengine's own objects in its checkpoints
    load_backbone_checkpoint(target, checkpoint, prefix, strict)
    return model
