from .checkpoint import (allow_mmengine_checkpoint_types, check_resume_checkpoint,
                         dump_atomic, find_resume_checkpoint, save_atomic, write_atomic)
from .distributed import setup_cpu_distributed
from .hooks import (DINOFreezeLastLayerHook, DINOTeacherMomentumHook,
                    DINOTeacherTempHook, ResumableCheckpointHook)
from .optimizers import (LayerDecayOptimWrapperConstructor, PerParamClipAmpOptimWrapper,
                         PerParamClipOptimWrapper)
from .rng_state import (epoch_worker_init_fn, gather_rng_states, get_rng_state,
                        set_rng_state)

__all__ = ['DINOFreezeLastLayerHook', 'DINOTeacherMomentumHook', 'DINOTeacherTempHook',
           'LayerDecayOptimWrapperConstructor', 'PerParamClipAmpOptimWrapper',
           'PerParamClipOptimWrapper', 'ResumableCheckpointHook',
           'allow_mmengine_checkpoint_types', 'check_resume_checkpoint', 'dump_atomic',
           'epoch_worker_init_fn',
           'find_resume_checkpoint', 'gather_rng_states', 'get_rng_state',
           'save_atomic', 'set_rng_state', 'setup_cpu_distributed', 'write_atomic']
