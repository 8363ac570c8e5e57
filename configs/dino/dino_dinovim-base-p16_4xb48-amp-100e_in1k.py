# DINO pretraining of DinoVim-B on ImageNet-1k, the official Dino-Mamba recipe:
# 4 GPUs x 48 images, fp16 AMP, 100 epochs, 2 global + 8 local crops.
# Paper: linear probe 78.1 top-1 (configs/linear_probe/).
_base_ = [
    '../_base_/models/dino_dinovim-base-p16.py',
    '../_base_/datasets/imagenet_bs48_dino-multicrop.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    'mmpretrain::_base_/default_runtime.py',
]

optim_wrapper = dict(type='PerParamClipAmpOptimWrapper')  # fp16, dynamic loss scale
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='ResumableCheckpointHook', interval=1, max_keep_ckpts=3))
