from .checkpoint import (InertRecord, UnsafeCheckpointError,
                         allow_mmengine_checkpoint_types, check_resume_checkpoint,
                         dump_atomic, find_resume_checkpoint, load_checkpoint_file,
                         load_official_checkpoint, save_atomic, write_atomic)
from .cpu_threads import default_cpu_threads, setup_cpu_threads
from .distributed import (CPUDistributedDataParallel, setup_cpu_distributed,
                          teardown_distributed)
from .finite import non_finite
from .hooks import (CompileModulesHook, CUDAGraphBlocksHook, DINOFreezeLastLayerHook,
                    DINOTeacherMomentumHook, DINOTeacherTempHook, InitialWeightsHook,
                    KNNMonitorHook, NonFiniteStopHook, ResumableCheckpointHook,
                    StrictLoadHook)
from .optimizers import (GroupedOptimWrapperConstructor, LayerDecayOptimWrapperConstructor,
                         PerParamClipAmpOptimWrapper, PerParamClipOptimWrapper)
from .pretrained import check_pretrained_checkpoints
from .rng_state import (epoch_worker_init_fn, gather_rng_states, get_rng_state,
                        set_rng_state)
from .run_checks import build_checked_loop, check_config_keys
from .work_dir_lock import WorkDirLock, WorkDirLockedError

__all__ = ['CPUDistributedDataParallel', 'CUDAGraphBlocksHook', 'CompileModulesHook',
           'DINOFreezeLastLayerHook', 'DINOTeacherMomentumHook', 'DINOTeacherTempHook',
           'GroupedOptimWrapperConstructor', 'InertRecord', 'InitialWeightsHook',
           'KNNMonitorHook', 'LayerDecayOptimWrapperConstructor', 'NonFiniteStopHook',
           'PerParamClipAmpOptimWrapper', 'PerParamClipOptimWrapper',
           'ResumableCheckpointHook', 'StrictLoadHook', 'UnsafeCheckpointError',
           'WorkDirLock', 'WorkDirLockedError', 'allow_mmengine_checkpoint_types',
           'build_checked_loop', 'check_config_keys', 'check_pretrained_checkpoints',
           'check_resume_checkpoint', 'default_cpu_threads', 'dump_atomic',
           'epoch_worker_init_fn', 'find_resume_checkpoint', 'gather_rng_states',
           'get_rng_state', 'load_checkpoint_file', 'load_official_checkpoint',
           'non_finite', 'save_atomic', 'set_rng_state', 'setup_cpu_distributed',
           'setup_cpu_threads', 'teardown_distributed', 'write_atomic']
