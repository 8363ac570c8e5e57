from .compile_hook import CompileModulesHook
from .dino_freeze_last_layer_hook import DINOFreezeLastLayerHook
from .dino_teacher_momentum_hook import DINOTeacherMomentumHook
from .dino_teacher_temp_hook import DINOTeacherTempHook
from .resumable_checkpoint_hook import ResumableCheckpointHook

__all__ = ['CompileModulesHook', 'DINOFreezeLastLayerHook', 'DINOTeacherMomentumHook',
           'DINOTeacherTempHook', 'ResumableCheckpointHook']
