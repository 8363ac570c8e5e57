# The DINO pretraining recipe of the official Dino-Mamba code, without its model:
# ImageNet-1k, 2 global + 8 local crops, 4 GPUs x 48 images, fp16 AMP, 100 epochs
# (AdamW, cosine schedules, the DINO hooks). A leaf adds a model fragment.
_base_ = [
    '../../_base_/datasets/imagenet_bs48_dino-multicrop.py',
    '../../_base_/schedules/dino_adamw-coslr-100e.py',
    '../../_base_/default_runtime.py',
]

optim_wrapper = dict(type='PerParamClipAmpOptimWrapper')  # fp16, dynamic loss scale
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='ResumableCheckpointHook', interval=1, max_keep_ckpts=3))
