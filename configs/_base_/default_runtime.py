# mmpretrain's runtime, with training stopped at the first non-finite loss or
# gradient (naming the iteration and the tensor) before anything of that iteration
# is saved, so the last good checkpoint stays (NonFiniteStopHook).
_base_ = 'mmpretrain::_base_/default_runtime.py'

default_hooks = dict(non_finite=dict(type='NonFiniteStopHook'))
