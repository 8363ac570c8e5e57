"""The model zoo: one set of backbone names, the shipped configs and the model index.

Backbone names are mmpretrain's style, ``<family>-<size>`` (``dinovim-tiny``,
``linearvit-base``); every tool takes them, and the short forms that tools used to
take (``dinovim-t``, ``reg-b``) as aliases (:data:`BACKBONES`, :func:`canonical_name`).

The configs and ``model-index.yml`` ship with the package: in a checkout (and an
editable install) they are the repository's ``configs/`` and ``model-index.yml``
beside the package; a regular install carries copies under ``mmdinomamba/.mim/``,
as OpenMMLab packages do (``setup.py`` puts them there). :func:`package_root` finds
whichever is present, so tools run from any folder.

:func:`register_model_index` hands the index to mmpretrain's ``ModelHub`` (done on
``import mmdinomamba``), so that ``mmpretrain.list_models('*dinovim*')`` and
``mmpretrain.get_model(name)`` know our models (the dense ones too: their configs
carry their scope). mmseg 1.2.2 and mmdet 3.3.0 have no hub to register with:
their inferencers read their own package's index only, so dense models are reached
by config path (``MMSegInferencer(model=config_path(...), weights=CKPT)``).
"""
import logging
import os.path as osp
from typing import Dict, List, Optional, Tuple

from mmengine.logging import print_log

# canonical name -> (backbone config, short aliases, the paper's parameter count in
# millions where the paper gives one for this backbone)
BACKBONES: Dict[str, Tuple[dict, Tuple[str, ...], Optional[float]]] = {
    'dinovim-tiny': (dict(type='DinoVim', arch='tiny'), ('dinovim-t', ), None),
    'dinovim-small': (dict(type='DinoVim', arch='small'), ('dinovim-s', ), None),
    'dinovim-base': (dict(type='DinoVim', arch='base'), ('dinovim-b', ), 88.0),
    'dinomamba-reg-base': (dict(type='DinoVim', arch='base', num_registers=12),
                           ('reg-b', 'dinomamba-reg-b'), 88.0),
    'linearvit-base': (dict(type='LinearViT', arch='base'), ('linearvit-b', ), 85.0),
    'vit-base': (dict(type='VisionTransformer', arch='base'), ('vit-b', ), 85.0),
    'mlla-tiny': (dict(type='MLLA', arch='tiny'), ('mlla-t', ), None),
    'mlla-small': (dict(type='MLLA', arch='small'), ('mlla-s', ), None),
    'mlla-base': (dict(type='MLLA', arch='base'), ('mlla-b', ), None),
}
ALIASES: Dict[str, str] = {alias: name for name, (_, aliases, _) in BACKBONES.items()
                           for alias in aliases}
# where the configs and the index are, relative to package_root()
MODEL_INDEX = 'model-index.yml'
CONFIGS = 'configs'

_REGISTERED: List[str] = []


def canonical_name(name: str) -> str:
    """The canonical backbone name of ``name`` (a canonical name or an alias, any
    case; ``-p16`` / ``-p8`` patch suffixes are kept).

    Raises:
        ValueError: ``name`` is neither; the message lists the names.
    """
    text = name.strip().lower()
    patch = ''
    for suffix in ('-p16', '-p8'):
        if text.endswith(suffix):
            text, patch = text[:-len(suffix)], suffix
    text = ALIASES.get(text, text)
    if text not in BACKBONES:
        choices = ', '.join(f"{n} ({'/'.join(a)})" for n, (_, a, _) in BACKBONES.items())
        raise ValueError(f'unknown model name {name!r}; the names (aliases in '
                         f'brackets): {choices}')
    return text + patch


def backbone_config(name: str) -> dict:
    """A copy of the backbone config of ``name`` (any accepted form, no patch suffix)."""
    return dict(BACKBONES[canonical_name(name)][0])


def package_root() -> str:
    """The folder holding ``configs/`` and ``model-index.yml``.

    A checkout's root (the repository, beside the package) comes first; else the
    ``.mim`` folder inside the installed package.

    Raises:
        FileNotFoundError: neither holds the model index (a broken install).
    """
    package = osp.dirname(osp.abspath(__file__))
    for root in (osp.dirname(package), osp.join(package, '.mim')):
        if osp.isfile(osp.join(root, MODEL_INDEX)) and \
                osp.isdir(osp.join(root, CONFIGS)):
            return root
    raise FileNotFoundError(
        f'mmdinomamba: no {MODEL_INDEX} and {CONFIGS}/ beside the package '
        f'({osp.dirname(package)}) or in {osp.join(package, ".mim")}: reinstall it '
        '(pip install -e . in a checkout, or pip install . for a copy)')


def config_path(*parts: str) -> str:
    """Absolute path of a shipped config or config folder, e.g.
    ``config_path('robustness')`` or ``config_path('dino', 'dino_...py')``."""
    return osp.join(package_root(), CONFIGS, *parts)


def model_index_path() -> str:
    """Absolute path of the shipped ``model-index.yml``."""
    return osp.join(package_root(), MODEL_INDEX)


def register_model_index() -> bool:
    """Register our model index with mmpretrain's ``ModelHub``, once per process.

    Every model of the index is registered, the mmseg and mmdet ones too:
    ``mmpretrain.get_model`` builds them (their configs carry their scope), while
    mmpretrain's inferencers take the classification ones.

    Returns:
        bool: whether this call registered it (False without mmpretrain, or when it
        is registered already).
    """
    if _REGISTERED:
        return False
    try:
        from mmpretrain.apis import ModelHub
    except ImportError:
        return False
    try:
        root = package_root()
    except FileNotFoundError as err:
        print_log(f'{err}; mmpretrain.list_models() will not list our models',
                  logger='current', level=logging.WARNING)
        return False
    ModelHub.register_model_index(osp.join(root, MODEL_INDEX), config_prefix=root)
    _REGISTERED.append(model_index_path())
    return True
