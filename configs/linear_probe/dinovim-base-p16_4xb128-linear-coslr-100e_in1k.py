# Linear probe of DINO-pretrained DinoVim-B on ImageNet-1k: frozen backbone,
# readouts of the last 8 blocks concatenated, one linear layer, SGD, 100 epochs.
# Paper: 78.1 top-1.
_base_ = [
    '../_base_/models/linear-probe_dinovim-base-p16.py',
    '../_base_/datasets/imagenet_bs128_linear-probe.py',
    '../_base_/schedules/linear-probe_sgd-coslr-100e.py',
    '../_base_/default_runtime.py',
]

optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
# the frozen backbone's blocks replay from CUDA graphs, in training and testing
# (CUDAGraphBlocksHook; a ViT runs eagerly). Off: --cfg-options custom_hooks=[]
custom_hooks = [dict(type='CUDAGraphBlocksHook')]
default_hooks = dict(
    checkpoint=dict(type='ResumableCheckpointHook', interval=10, max_keep_ckpts=3))
