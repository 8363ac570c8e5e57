"""mmdinomamba: visual Mamba models for OpenMMLab.

Importing the package registers its classes into whichever of mmpretrain, mmseg and
mmdet are installed (see :mod:`mmdinomamba.registry`), so configs only need
``custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)``.
"""
from .registry import register_all_modules
from .version import __version__

register_all_modules()

__all__ = ['__version__', 'register_all_modules']
