# Linear probe of the toy DINO run (configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py)
# on the toy dataset's 4 classes: the recipe of the DinoVim-T probe, shrunk to a
# CPU minute (readouts of the last 2 of 4 blocks, 64 px crops, 10 epochs).
_base_ = './dinovim-tiny-p16_4xb128-linear-coslr-100e_in1k.py'

data_root = 'data/toy'
num_blocks = 2
max_epochs = 10
model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=64, num_layers=4),
        img_size=64,
        patch_size=8,
        mixer_cfg=dict(d_state=16, headdim=16, ssd_backend='quadratic'),
        out_indices=list(range(-num_blocks, 0)),
        frozen_stages=4,
        init_cfg=dict(checkpoint='work_dirs/dino_dinovim-toy-p8_1xb8-10e_toy/'
                      f'epoch_{max_epochs}.pth')),
    neck=dict(in_channels=64 * num_blocks),
    head=dict(num_classes=4, in_channels=64 * num_blocks))
data_preprocessor = dict(num_classes=4)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, backend='pillow'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=73, edge='short', interpolation='bicubic',
         backend='pillow'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
toy_dataset = dict(data_root=data_root, classes=f'{data_root}/classes.txt')
train_dataloader = dict(batch_size=16, num_workers=1,
                        dataset=dict(pipeline=train_pipeline, **toy_dataset))
val_dataloader = dict(batch_size=16, num_workers=1,
                      dataset=dict(pipeline=test_pipeline, **toy_dataset))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(lr=0.01))
auto_scale_lr = dict(base_batch_size=16)
param_scheduler = [
    dict(type='CosineAnnealingLR', T_max=max_epochs, by_epoch=True, begin=0,
         end=max_epochs)
]
# validated once, after the last epoch (2000 held-out images in make demo)
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)

env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=2),
    checkpoint=dict(type='ResumableCheckpointHook', interval=max_epochs, max_keep_ckpts=1))
