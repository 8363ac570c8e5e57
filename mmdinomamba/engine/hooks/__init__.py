from .compile_hook import CompileModulesHook
from .cuda_graph_hook import CUDAGraphBlocksHook
from .dino_freeze_last_layer_hook import DINOFreezeLastLayerHook
from .dino_teacher_momentum_hook import DINOTeacherMomentumHook
from .dino_teacher_temp_hook import DINOTeacherTempHook
from .initial_weights_hook import InitialWeightsHook
from .knn_monitor_hook import KNNMonitorHook
from .non_finite_stop_hook import NonFiniteStopHook
from .resumable_checkpoint_hook import ResumableCheckpointHook
from .strict_load_hook import StrictLoadHook

__all__ = ['CUDAGraphBlocksHook', 'CompileModulesHook', 'DINOFreezeLastLayerHook',
           'DINOTeacherMomentumHook', 'DINOTeacherTempHook', 'InitialWeightsHook',
           'KNNMonitorHook', 'NonFiniteStopHook', 'ResumableCheckpointHook',
           'StrictLoadHook']
