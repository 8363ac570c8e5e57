"""mmdinomamba: visual Mamba models for OpenMMLab.

Importing the package registers its classes into whichever of mmpretrain, mmseg and
mmdet are installed (see :mod:`mmdinomamba.registry`), so configs only need
``custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)``. It also
allow-lists the data types of mmengine's checkpoints for
``torch.load(weights_only=True)`` (see :mod:`mmdinomamba.engine.checkpoint`), so
upstream loaders read the checkpoints ``tools/train.py`` writes without running
anything from the file.
"""
from .engine.checkpoint import allow_mmengine_checkpoint_types
from .registry import register_all_modules
from .version import __version__

register_all_modules()
allow_mmengine_checkpoint_types()

__all__ = ['__version__', 'register_all_modules']
