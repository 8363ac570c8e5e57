"""mmdinomamba: visual Mamba models for OpenMMLab.

Importing the package registers its classes into whichever of mmpretrain, mmseg and
mmdet are installed (see :mod:`mmdinomamba.registry`), so configs only need
``custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)``. It also
allow-lists the data types of mmengine's checkpoints for
``torch.load(weights_only=True)`` (see :mod:`mmdinomamba.utils.safe_load`), so
upstream loaders read the checkpoints ``tools/train.py`` writes without running
anything from the file; makes mmengine's inferencers and resume read a config
stored in a checkpoint as data (see :mod:`mmdinomamba.utils.safe_config`);
replaces mmengine's ``Pretrained`` initialiser by one that refuses tensors of
another shape and non-finite ones (see
:class:`mmdinomamba.models.checkpoint.CheckedPretrainedInit`); and registers the
model index with mmpretrain's ``ModelHub`` (see :mod:`mmdinomamba.zoo`), so ``mmpretrain.list_models('*dinovim*')``
and ``mmpretrain.get_model(name)`` know our models.
"""
from .models.checkpoint import register_checked_pretrained
from .registry import register_all_modules
from .utils import allow_mmengine_checkpoint_types, read_checkpoint_configs_as_data
from .version import __version__
from .zoo import register_model_index

register_all_modules()
allow_mmengine_checkpoint_types()
read_checkpoint_configs_as_data()
register_checked_pretrained()
register_model_index()

__all__ = ['__version__', 'register_all_modules']
