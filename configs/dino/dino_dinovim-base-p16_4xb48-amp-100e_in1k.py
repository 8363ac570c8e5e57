# DINO pretraining of DinoVim-B on ImageNet-1k, the official Dino-Mamba recipe:
# 4 GPUs x 48 images, fp16 AMP, 100 epochs, 2 global + 8 local crops.
# Paper: linear probe 78.1 top-1 (configs/linear_probe/).
_base_ = [
    '../_base_/models/dino_dinovim-base-p16.py',
    '../_base_/datasets/imagenet_bs48_dino-multicrop.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/default_runtime.py',
]

optim_wrapper = dict(type='PerParamClipAmpOptimWrapper')  # fp16, dynamic loss scale
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='ResumableCheckpointHook', interval=1, max_keep_ckpts=3))
# Both backbones' 24 blocks replayed from CUDA graphs, one capture per crop size
# during the first iteration: an eager step is otherwise bound by the host's Python
# (docs/benchmark.md). Same kernels, same numbers; on a CPU the blocks run eagerly.
# Plain eager: --cfg-options "custom_hooks=[...]" without it, or delete this line.
custom_hooks = _base_.custom_hooks + [dict(type='CUDAGraphBlocksHook')]
