# What MLLA-T/S/B and every ablation model train with: ImageNet-1k at 224 px and
# MLLA's official recipe in mmpretrain terms (./schedules/, 300 epochs of AdamW
# at 4096 images per step, 32 GPUs x 128; see docs/mlla.md). MESA is not part of it.
# The stages' blocks replay from CUDA graphs (CUDAGraphBlocksHook: the eager step is
# bound by the host's launches; the numbers are eager's; CPU runs stay eager).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    './schedules/mlla_adamw-300e_bs4096.py',
    '../../_base_/default_runtime.py',
]

train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader
custom_hooks = _base_.custom_hooks + [dict(type='CUDAGraphBlocksHook')]
