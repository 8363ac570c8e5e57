from .cpu_threads import default_cpu_threads, setup_cpu_threads
from .distributed import (CPUDistributedDataParallel, setup_cpu_distributed,
                          teardown_distributed)
from .finite import non_finite
from .graphed_blocks import graph_blocks, graphed_modules
from .hooks import (CompileModulesHook, CUDAGraphBlocksHook, DINOFreezeLastLayerHook,
                    DINOTeacherMomentumHook, DINOTeacherTempHook, InitialWeightsHook,
                    KNNMonitorHook, NonFiniteStopHook, ResumableCheckpointHook,
                    StrictLoadHook)
from .optimizers import (GroupedOptimWrapperConstructor, LayerDecayOptimWrapperConstructor,
                         PerParamClipAmpOptimWrapper, PerParamClipOptimWrapper)
from .pretrained import check_pretrained_checkpoints
from .rng_state import (epoch_worker_init_fn, gather_rng_states, get_rng_state,
                        set_rng_state)
from .run_checks import (amp_device_available, build_checked_loop, check_amp_device,
                         check_config_keys, check_config_types)
from .run_config import (AMP_WRAPPERS, amp_twin, fit_schedule, parse_cfg_options,
                         run_length, set_data_root,
                         set_num_workers, set_run_length)
from .work_dir import (check_resume_checkpoint, epoch_checkpoints, epoch_losses,
                       find_resume_checkpoint, latest_checkpoint, logged_runs,
                       read_scalars, run_folders, set_work_dir)
from .work_dir_lock import WorkDirLock, WorkDirLockedError

__all__ = ['AMP_WRAPPERS', 'CompileModulesHook', 'CPUDistributedDataParallel',
           'CUDAGraphBlocksHook', 'DINOFreezeLastLayerHook', 'DINOTeacherMomentumHook',
           'DINOTeacherTempHook', 'GroupedOptimWrapperConstructor',
           'InitialWeightsHook', 'KNNMonitorHook', 'LayerDecayOptimWrapperConstructor',
           'NonFiniteStopHook', 'PerParamClipAmpOptimWrapper',
           'PerParamClipOptimWrapper', 'ResumableCheckpointHook', 'StrictLoadHook',
           'WorkDirLock', 'WorkDirLockedError', 'amp_device_available', 'amp_twin',
           'build_checked_loop', 'check_amp_device', 'check_config_keys',
           'check_config_types', 'check_pretrained_checkpoints',
           'check_resume_checkpoint', 'default_cpu_threads', 'epoch_checkpoints',
           'epoch_losses', 'epoch_worker_init_fn', 'find_resume_checkpoint',
           'fit_schedule', 'gather_rng_states', 'get_rng_state', 'graph_blocks',
           'graphed_modules', 'latest_checkpoint',
           'logged_runs', 'non_finite', 'parse_cfg_options', 'read_scalars',
           'run_folders', 'run_length', 'set_data_root', 'set_num_workers',
           'set_rng_state', 'set_run_length', 'set_work_dir', 'setup_cpu_distributed',
           'setup_cpu_threads', 'teardown_distributed']
