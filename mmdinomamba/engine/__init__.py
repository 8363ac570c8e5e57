from .checkpoint import (allow_mmengine_checkpoint_types, dump_atomic, save_atomic,
                         write_atomic)
from .distributed import CPUDistributedDataParallel, setup_cpu_distributed
from .hooks import (DINOFreezeLastLayerHook, DINOTeacherMomentumHook,
                    DINOTeacherTempHook)
from .optimizers import (LayerDecayOptimWrapperConstructor, PerParamClipAmpOptimWrapper,
                         PerParamClipOptimWrapper)
from .pretrained import check_pretrained_checkpoints

__all__ = ['CPUDistributedDataParallel', 'DINOFreezeLastLayerHook',
           'DINOTeacherMomentumHook', 'DINOTeacherTempHook',
           'LayerDecayOptimWrapperConstructor', 'PerParamClipAmpOptimWrapper',
           'PerParamClipOptimWrapper', 'allow_mmengine_checkpoint_types',
           'check_pretrained_checkpoints', 'dump_atomic', 'save_atomic',
           'setup_cpu_distributed', 'write_atomic']
