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
import logging
from typing import Dict, List, Set, Tuple

from mmengine.logging import print_log

ALL = ('mmpretrain', 'mmseg', 'mmdet')
CLS_SEG = ('mmpretrain', 'mmseg')
PRETRAIN = ('mmpretrain', )
SEG_DET = ('mmseg', 'mmdet')

# (class import path, registry name, downstream packages)
REGISTRATIONS: List[Tuple[str, str, Tuple[str, ...]]] = [
    ('mmdinomamba.models.mixers.SSDMixer', 'MODELS', ALL),
    ('mmdinomamba.models.backbones.DinoVim', 'MODELS', ALL),
    ('mmdinomamba.models.backbones.LinearViT', 'MODELS', ALL),
    ('mmdinomamba.models.backbones.MLLA', 'MODELS', ALL),
    ('mmdinomamba.models.backbones.PlainMLLA', 'MODELS', ALL),
    ('mmdinomamba.models.mixers.LinearAttentionMixer', 'MODELS', ALL),
    ('mmdinomamba.evaluation.BinaryAUC', 'METRICS', CLS_SEG),
    # Binary-AUC evaluation: activation maps as predictions, ImageNet-S label maps
    ('mmdinomamba.analysis.ActivationMapModel', 'MODELS', CLS_SEG),
    ('mmdinomamba.datasets.imagenet_s.ImageNetS', 'DATASETS', PRETRAIN),
    ('mmdinomamba.datasets.transforms.LoadRGBLabelMap', 'TRANSFORMS', PRETRAIN),
    # layer-wise lr decay for UperNet / Cascade Mask R-CNN fine-tuning
    ('mmdinomamba.engine.optimizers.LayerDecayOptimWrapperConstructor',
     'OPTIM_WRAPPER_CONSTRUCTORS', SEG_DET),
    # one optimizer group per distinct setting (not per tensor): DINO's recipe
    ('mmdinomamba.engine.optimizers.GroupedOptimWrapperConstructor',
     'OPTIM_WRAPPER_CONSTRUCTORS', ALL),
    # DINO (self-supervised pretraining) and its linear probe; mmdet has its own DINO
    ('mmdinomamba.models.selfsup.DINO', 'MODELS', PRETRAIN),
    ('mmdinomamba.models.heads.DINOHead', 'MODELS', PRETRAIN),
    ('mmdinomamba.models.losses.DINOLoss', 'MODELS', PRETRAIN),
    ('mmdinomamba.models.necks.ConcatNeck', 'MODELS', PRETRAIN),
    # any folder of images (with or without class folders) for DINO
    ('mmdinomamba.datasets.image_folder.ImageFolder', 'DATASETS', PRETRAIN),
    ('mmdinomamba.datasets.transforms.DINOMultiCrop', 'TRANSFORMS', PRETRAIN),
    ('mmdinomamba.datasets.transforms.HueSafeColorJitter', 'TRANSFORMS', PRETRAIN),
    ('mmdinomamba.engine.hooks.DINOTeacherMomentumHook', 'HOOKS', PRETRAIN),
    ('mmdinomamba.engine.hooks.DINOTeacherTempHook', 'HOOKS', PRETRAIN),
    ('mmdinomamba.engine.hooks.DINOFreezeLastLayerHook', 'HOOKS', PRETRAIN),
    ('mmdinomamba.engine.hooks.KNNMonitorHook', 'HOOKS', PRETRAIN),
    # the weights a run starts from (its own random init, for comparisons)
    ('mmdinomamba.engine.hooks.InitialWeightsHook', 'HOOKS', ALL),
    # checkpoints written atomically, with every rank's RNG states (exact resume)
    ('mmdinomamba.engine.hooks.ResumableCheckpointHook', 'HOOKS', ALL),
    # training stops at the first non-finite loss or gradient, before any save
    ('mmdinomamba.engine.hooks.NonFiniteStopHook', 'HOOKS', ALL),
    # a loaded checkpoint must fill the model and be finite (tools/train.py, test.py)
    ('mmdinomamba.engine.hooks.StrictLoadHook', 'HOOKS', ALL),
    # torch.compile of named submodules (the backbones), selected in the config
    ('mmdinomamba.engine.hooks.CompileModulesHook', 'HOOKS', ALL),
    # the backbones' blocks replayed from CUDA graphs (eager kernels, no compile)
    ('mmdinomamba.engine.hooks.CUDAGraphBlocksHook', 'HOOKS', ALL),
    ('mmdinomamba.engine.optimizers.PerParamClipOptimWrapper', 'OPTIM_WRAPPERS',
     PRETRAIN),
    ('mmdinomamba.engine.optimizers.PerParamClipAmpOptimWrapper', 'OPTIM_WRAPPERS',
     PRETRAIN),
    # robustness: ImageNet-Sketch / -A / -R and the ReaL labels of ImageNet val
    ('mmdinomamba.datasets.robustness.ImageNetSketch', 'DATASETS', PRETRAIN),
    ('mmdinomamba.datasets.robustness.ImageNetA', 'DATASETS', PRETRAIN),
    ('mmdinomamba.datasets.robustness.ImageNetR', 'DATASETS', PRETRAIN),
    ('mmdinomamba.evaluation.subset_accuracy.SubsetAccuracy', 'METRICS', PRETRAIN),
    ('mmdinomamba.evaluation.real.ReaLAccuracy', 'METRICS', PRETRAIN),
]

_DONE: Dict[Tuple[str, str, str], bool] = {}
_WARNED: Set[str] = set()


def _import_object(path: str):
    module, name = path.rsplit('.', 1)
    return getattr(importlib.import_module(module), name)


def _downstream_registry(package: str, registry: str):
    """The registry object of an installed package, or None if it is absent."""
    try:
        module = importlib.import_module(f'{package}.registry')
    except ImportError as err:
        if (err.name is None or err.name.split('.')[0] != package) and \
                package not in _WARNED:
            _WARNED.add(package)
            # installed but broken (e.g. mmcv without its compiled ops): say so
            print_log(f'mmdinomamba: cannot import {package}.registry ({err}); '
                      f'skipping registration into {package}', logger='current',
                      level=logging.WARNING)
        return None
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
                          level=logging.DEBUG)
                continue
            cls = _import_object(path)
            if registry.module_dict.get(cls.__name__) is not cls:
                registry.register_module(module=cls)
            _DONE[key] = True
            done.append(f'{package}.{registry_name}.{cls.__name__}')
    return done
