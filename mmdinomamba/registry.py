"""The one place that hooks mmdinomamba's classes into the OpenMMLab registries.

Every registration is a row of ``REGISTRATIONS``: the class (as an import path, so
classes that need a downstream package are imported only when that package is
there), the registry name, and the downstream packages whose registry receives it.
A downstream package that is not installed is skipped, never fatal; a class of ours
that fails to import is a bug and raises.

Name clash to know: mmdet already registers a detector called ``DINO``, so our
self-supervised ``DINO`` goes into mmpretrain's registry only.
"""
import importlib
from typing import Dict, List, Tuple

from mmengine.logging import print_log

ALL = ('mmpretrain', 'mmseg', 'mmdet')
CLS_SEG = ('mmpretrain', 'mmseg')
PRETRAIN = ('mmpretrain', )

# (class import path, registry name, downstream packages)
REGISTRATIONS: List[Tuple[str, str, Tuple[str, ...]]] = [
    ('mmdinomamba.models.mixers.SSDMixer', 'MODELS', ALL),
    ('mmdinomamba.models.backbones.DinoVim', 'MODELS', ALL),
    ('mmdinomamba.models.backbones.LinearViT', 'MODELS', ALL),
]

_DONE: Dict[Tuple[str, str, str], bool] = {}


def _import_object(path: str):
    module, name = path.rsplit('.', 1)
    return getattr(importlib.import_module(module), name)


def _downstream_registry(package: str, registry: str):
    """The registry object of an installed package, or None if it is absent."""
    try:
        module = importlib.import_module(f'{package}.registry')
    except ImportError as err:
        # Only "package not installed" is tolerated; a broken install re-raises.
        if err.name is not None and err.name.split('.')[0] == package:
            return None
        raise
    return getattr(module, registry)


def register_all_modules() -> List[str]:
    """Register every row of ``REGISTRATIONS`` into the installed packages.

    Idempotent. Returns the ``'package.REGISTRY.ClassName'`` entries registered by
    this call.
    """
    done = []
    for path, registry_name, packages in REGISTRATIONS:
        for package in packages:
            key = (path, registry_name, package)
            if _DONE.get(key):
                continue
            registry = _downstream_registry(package, registry_name)
            if registry is None:
                print_log(f'mmdinomamba: {package} is not installed; '
                          f'{path} not registered there', logger='current',
                          level=10)  # DEBUG
                continue
            cls = _import_object(path)
            if registry.module_dict.get(cls.__name__) is not cls:
                registry.register_module(module=cls)
            _DONE[key] = True
            done.append(f'{package}.{registry_name}.{cls.__name__}')
    return done
