# DINO on the toy dataset (python tools/make_toy_data.py data/toy): the whole
# recipe of dino_dinovim-tiny-p16_4xb48-amp-100e_in1k.py, shrunk to run on a CPU in
# about a minute: a 4-block, 64-wide DinoVim with 8 px patches, 64 px global and
# 32 px local crops (4 of them), a 1024-prototype head with BatchNorm, 10 epochs
# of 8 batches, and a faster teacher (momentum 0.96 -> 1).
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
    # BatchNorm in the head (the official code's `use_bn_in_head`): at
    # initialisation the toy images' features are nearly parallel (cosine 0.93),
    # and without it the centred teacher is uniform from the start
    head=dict(in_channels=64, out_channels=out_channels, hidden_channels=256,
              bottleneck_channels=64, use_bn=True),
    loss=dict(out_channels=out_channels),
    teacher_momentum=0.96)

# the multi-crop pipeline with 64 px global and 4 local 32 px crops, and DINO's
# blur radius range (0.1, 2) px, set for 224 px crops, scaled by 64 / 224: the
# full range wipes out the few-pixel textures of the rich toy images
train_pipeline = [
    dict(t, global_size=64, local_size=32, num_local_views=4, blur_radius=(0.03, 0.57))
    if t.type == 'DINOMultiCrop' else dict(t) for t in _base_.train_pipeline
]
train_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=False,
    pin_memory=False,
    dataset=dict(data_root=data_root, pipeline=train_pipeline))

# fp32 (AMP needs a GPU); the paper's peak lr without the batch scaling, so that
# an 80-iteration run moves
optim_wrapper = dict(type='PerParamClipOptimWrapper', optimizer=dict(lr=5e-4))
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
# the paper's teacher momentum 0.996 averages over 250 of its ~125k iterations; in
# an 80-iteration run the teacher would stay the random initialisation. 0.96
# (25 iterations) lets it follow the student; still cosine to 1.
custom_hooks = [
    dict(type='DINOTeacherMomentumHook', base_momentum=0.96, final_momentum=1.0),
    dict(type='DINOTeacherTempHook', final_temp=0.04, warmup_temp=0.04,
         warmup_epochs=0),
    # the prototypes stay at their random init for the whole run (the paper
    # freezes them for the first epoch): when they learn, this tiny run's
    # bottleneck drifts out of their span, the teacher's logits flatten (spread
    # over K 0.03 instead of 0.12 frozen), the teacher turns near-uniform and the
    # loss climbs back to log K (docs/comparison.md)
    dict(type='DINOFreezeLastLayerHook', freeze_epochs=max_epochs),
    # <work_dir>/init.pth: the weights training starts from (make demo measures
    # the teacher against them)
    dict(type='InitialWeightsHook'),
]

env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=4),
    checkpoint=dict(type='ResumableCheckpointHook', interval=5, max_keep_ckpts=2))
log_processor = dict(window_size=4)
