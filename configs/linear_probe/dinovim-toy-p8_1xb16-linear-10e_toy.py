# Linear probe of the toy DINO run (configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py)
# on the toy dataset's 4 classes: the DinoVim probe (readouts of the last blocks,
# frozen backbone, one linear layer) on the toy DinoVim, shrunk to a CPU minute
# (the last 2 of 4 blocks, 64 px crops, 10 epochs). Composed of fragments: probe
# model, toy backbone, toy data, toy schedule, runtime.
_base_ = [
    '../_base_/models/linear-probe_dinovim-base-p16.py',
    '../_base_/models/dinovim-toy-p8.py',
    '../_base_/datasets/toy-rich_linear-probe-64px.py',
    '../_base_/schedules/linear-probe_toy-sgd-coslr.py',
    '../_base_/default_runtime.py',
]

num_blocks = 2
max_epochs = 10
model = dict(
    backbone=dict(
        **_base_.toy_backbone,
        out_indices=list(range(-num_blocks, 0)),
        frozen_stages=4,
        init_cfg=dict(checkpoint='work_dirs/dino_dinovim-toy-p8_1xb8-10e_toy/'
                      f'epoch_{max_epochs}.pth')),
    neck=dict(in_channels=64 * num_blocks),
    head=dict(num_classes=4, in_channels=64 * num_blocks))
data_preprocessor = dict(num_classes=4)

# the ImageNet test view scaled to 64 px: the short side to 64 x 256 / 224, then
# the centre 64 px
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=73, edge='short', interpolation='bicubic',
         backend='pillow'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=16, num_workers=1)
val_dataloader = dict(batch_size=16, num_workers=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=0.01))
auto_scale_lr = dict(base_batch_size=16)
# validated once, after the last epoch (2000 held-out images in make demo)
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)

env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=2),
    checkpoint=dict(type='ResumableCheckpointHook', interval=max_epochs, max_keep_ckpts=1))
