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
# the model-index record that ``mmpretrain.get_model(<backbone name>)`` builds: the
# image classifier on that backbone (MLLA's own classifier; the DINO linear probe of
# the others, the paper's ImageNet-1k model of that backbone)
HUB_MODELS: Dict[str, str] = {
    'dinovim-tiny': 'dinovim-tiny-p16_dino-pre_4xb128-linear-coslr-100e_in1k',
    'dinovim-small': 'dinovim-small-p16_dino-pre_4xb128-linear-coslr-100e_in1k',
    'dinovim-base': 'dinovim-base-p16_dino-pre_4xb128-linear-coslr-100e_in1k',
    'dinomamba-reg-base': 'dinomamba-reg-base-p16_dino-pre_4xb128-linear-coslr-100e_in1k',
    'linearvit-base': 'linearvit-base-p16_dino-pre_4xb128-linear-coslr-100e_in1k',
    'vit-base': 'vit-base-p16_dino-pre_4xb128-linear-coslr-100e_in1k',
    'mlla-tiny': 'mlla-tiny_32xb128-300e_in1k',
    'mlla-small': 'mlla-small_32xb128-300e_in1k',
    'mlla-base': 'mlla-base_32xb128-300e_in1k',
}
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


def hub_name(name: str) -> Optional[str]:
    """The model-index record that the backbone name ``name`` (any accepted form,
    ``-p16`` allowed) stands for in ``mmpretrain.get_model``, or None."""
    try:
        canonical = canonical_name(name)
    except ValueError:
        return None
    if canonical.endswith('-p8'):
        return None
    return HUB_MODELS.get(canonical[:-len('-p16')] if canonical.endswith('-p16')
                          else canonical)


def missing_weights_message(name: str, data: dict) -> str:
    """What ``pretrained=True`` on the record ``name`` (its model-index fields
    ``data``) cannot do, and the ways to weights."""
    converted = data.get('Converted From') or {}
    lines = [f'{name} has no weights to download (its model-index record says '
             '`Weights: null`), so pretrained=True would give a randomly initialised '
             'model. Pass a checkpoint instead, pretrained=PATH:']
    if converted.get('Converter'):
        command = converted['Converter']
        lines.append(f"  - the official release, converted: download {converted['Weights']}"
                     f" ({converted.get('Code', 'the official code')}), run `{command}`"
                     f", then pretrained={command.split()[-1]!r};")
    lines.append("  - or your own checkpoint, e.g. one that tools/train.py wrote "
                 "(pretrained='work_dirs/<config>/epoch_N.pth').")
    lines.append('pretrained=False builds it randomly initialised on purpose.')
    return '\n'.join(lines)


def _hub_classes():
    """The hub's record class whose empty ``weights`` refuses to be used, and the
    name table that also answers to the backbone names (built on first use)."""
    from modelindex.models.Model import Model

    class RecordWithoutWeights(Model):
        """A record whose ``Weights`` is empty: reading ``weights`` (which
        mmpretrain's ``get_model`` does only for ``pretrained=True``) raises
        ValueError naming the ways to weights, instead of the silent random init."""

        @property
        def weights(self):
            value = self.data.get('Weights')
            if value is None:
                raise ValueError(missing_weights_message(self.name, self.data))
            return value

        @weights.setter
        def weights(self, value):
            self.data['Weights'] = value

    class NamesWithAliases(dict):
        """mmpretrain's name -> record table; a name it lacks is tried as one of
        our backbone names (:data:`HUB_MODELS`) by ``get`` (what ``ModelHub.get``
        calls). Listing (``list_models``) and ``in`` see only the records, so
        upstream's own names always win."""

        def get(self, key, default=None):
            if dict.__contains__(self, key):
                return dict.get(self, key)
            target = hub_name(key)
            return dict.get(self, target, default) if target else default

    return RecordWithoutWeights, NamesWithAliases


def register_model_index() -> bool:
    """Register our model index with mmpretrain's ``ModelHub``, once per process.

    Every model of the index is registered, the mmseg and mmdet ones too:
    ``mmpretrain.get_model`` builds them (their configs carry their scope), while
    mmpretrain's inferencers take the classification ones. Two additions:

    - the backbone names (``dinovim-tiny``, ``mlla-t``, ...) resolve to the record
      of :data:`HUB_MODELS` in ``get_model`` and the inferencers (not listed by
      ``list_models``);
    - ``pretrained=True`` on a record without weights (all of ours: none is
      hosted) raises ValueError naming the ways to weights (the converter of the
      official release, a local checkpoint), instead of building a random model.

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
    before = set(ModelHub._models_dict)
    ModelHub.register_model_index(osp.join(root, MODEL_INDEX), config_prefix=root)
    record_class, table_class = _hub_classes()
    for key in set(ModelHub._models_dict) - before:
        record = ModelHub._models_dict[key]
        if record.data.get('Weights') is None and \
                type(record) is record_class.__bases__[0]:
            record.__class__ = record_class
    if not isinstance(ModelHub._models_dict, table_class):
        ModelHub._models_dict = table_class(ModelHub._models_dict)
    _REGISTERED.append(model_index_path())
    return True
