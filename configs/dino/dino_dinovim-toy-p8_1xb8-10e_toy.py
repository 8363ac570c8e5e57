# DINO on the toy dataset (python tools/make_toy_data.py data/toy): the whole
# recipe of dino_dinovim-tiny-p16_4xb48-amp-100e_in1k.py, shrunk to run on a CPU in
# about a minute: a 4-block, 64-wide DinoVim with 8 px patches, 64 px global and
# 32 px local crops (4 of them), a 1024-prototype head, 10 epochs of 8 batches.
_base_ = './dino_dinovim-tiny-p16_4xb48-amp-100e_in1k.py'

data_root = 'data/toy'
out_channels = 1024
max_epochs = 10
model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=64, num_layers=4),
        img_size=64,
        patch_size=8,
        mixer_cfg=dict(d_state=16, headdim=16, ssd_backend='quadratic')),
    head=dict(in_channels=64, out_channels=out_channels, hidden_channels=256,
              bottleneck_channels=64),
    loss=dict(out_channels=out_channels))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='DINOMultiCrop', global_size=64, local_size=32, num_local_views=4),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=False,
    pin_memory=False,
    dataset=dict(data_root=data_root, pipeline=train_pipeline))

# fp32 (AMP needs a GPU); the paper's peak lr without the batch scaling, so that
# an 80-iteration run moves
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=5e-4))
auto_scale_lr = dict(base_batch_size=8)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - 1, eta_min=1e-6, by_epoch=True,
         begin=1, end=max_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay',
         eta_min_ratio=10.0, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs)

env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=4),
    checkpoint=dict(type='CheckpointHook', interval=5, max_keep_ckpts=2))
log_processor = dict(window_size=4)
