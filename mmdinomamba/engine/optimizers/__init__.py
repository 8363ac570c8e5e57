from .grouped_optim_wrapper_constructor import (GroupedOptimWrapperConstructor,
                                                merge_param_groups)
from .layer_decay_optim_wrapper_constructor import LayerDecayOptimWrapperConstructor
from .per_param_clip import (PerParamClipAmpOptimWrapper, PerParamClipOptimWrapper,
                             clip_grad_norm_per_param_)

__all__ = ['GroupedOptimWrapperConstructor', 'LayerDecayOptimWrapperConstructor',
           'PerParamClipAmpOptimWrapper',
           'PerParamClipOptimWrapper', 'clip_grad_norm_per_param_',
           'merge_param_groups']
