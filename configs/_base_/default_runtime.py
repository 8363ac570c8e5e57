# mmpretrain's runtime, with checkpoints written atomically, finite-checked and
# with the random states an exact resume needs (ResumableCheckpointHook: it takes
# CheckpointHook's arguments, and mmpretrain's interval of 1 stays), training
# stopped at the first non-finite loss or gradient (naming the iteration, the
# layer and the likely cause) before anything of that iteration is saved, so the
# last good checkpoint stays (NonFiniteStopHook), and one CPU
# thread on a machine without CUDA unless OMP_NUM_THREADS is set (CPUThreadsHook:
# DinoVim's many small operations run many times slower on several threads of a
# busy CPU), for upstream tools as for ours.
_base_ = 'mmpretrain::_base_/default_runtime.py'

default_hooks = dict(checkpoint=dict(type='ResumableCheckpointHook'),
                     non_finite=dict(type='NonFiniteStopHook'),
                     cpu_threads=dict(type='CPUThreadsHook'))
# mmpretrain's visualizer, restated here: a dict inherited from an `mmpretrain::`
# base carries mmengine's `_scope_` key, which tools that build the visualizer
# from its keys pass on (mmpretrain's browse_dataset.py: "Visualizer.__init__()
# got an unexpected keyword argument '_scope_'")
visualizer = dict(_delete_=True, type='UniversalVisualizer',
                  vis_backends=[dict(type='LocalVisBackend')])
