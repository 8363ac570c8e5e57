# DINO on the rich toy data (python tools/make_toy_data.py data/toy --style rich;
# make demo writes it): the DinoVim recipe shrunk to run on a CPU in about a
# minute: the toy DinoVim (4 blocks, 64 wide, 8 px patches), 64 px global and 32 px
# local crops (4 of them), a 1024-prototype head with BatchNorm, 10 epochs of 8
# batches, and a faster teacher (momentum 0.96 -> 1). Composed of fragments:
# model, toy backbone, toy data, toy schedule, runtime.
_base_ = [
    '../_base_/models/dino_dinovim-base-p16.py',
    '../_base_/models/dinovim-toy-p8.py',
    '../_base_/datasets/toy-rich_dino-multicrop-64px.py',
    '../_base_/schedules/dino_toy-adamw-coslr.py',
    '../_base_/default_runtime.py',
]

out_channels = 1024
max_epochs = 10
model = dict(
    backbone=dict(**_base_.toy_backbone),
    # BatchNorm in the head (the official code's `use_bn_in_head`): at
    # initialisation the toy images' features are nearly parallel (cosine 0.93),
    # and without it the centred teacher is uniform from the start
    head=dict(in_channels=64, out_channels=out_channels, hidden_channels=256,
              bottleneck_channels=64, use_bn=True),
    loss=dict(out_channels=out_channels),
    teacher_momentum=0.96)

train_dataloader = dict(batch_size=8, num_workers=1, persistent_workers=False,
                        pin_memory=False)

# the paper's peak lr without the batch scaling, so that an 80-iteration run moves
optim_wrapper = dict(optimizer=dict(lr=5e-4))
auto_scale_lr = dict(base_batch_size=8)
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
