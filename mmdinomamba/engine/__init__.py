from .checkpoint import (allow_mmengine_checkpoint_types, dump_atomic, save_atomic,
                         write_atomic)
from .cpu_threads import default_cpu_threads, setup_cpu_threads
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
           'check_pretrained_checkpoints', 'default_cpu_threads', 'dump_atomic',
           'save_atomic', 'setup_cpu_distributed', 'setup_cpu_threads', 'write_atomic']
