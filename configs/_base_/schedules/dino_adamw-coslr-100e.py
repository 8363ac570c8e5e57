# The DINO recipe of the official Dino-Mamba code: AdamW, 100 epochs, lr
# 5e-4 * batch / 256 after 10 linear warm-up epochs then cosine to 1e-6, weight
# decay 0.04 -> 0.4 (cosine, per iteration) on all but 1-D parameters, gradients
# clipped to norm 3.0 per parameter tensor (not all together), teacher momentum 0.996 -> 1 (cosine), teacher temperature 0.04, the
# output layer frozen during epoch 1.
optim_wrapper = dict(
    type='PerParamClipOptimWrapper',
    # one group per setting (decayed, not decayed) instead of one per tensor: the
    # same update, ~375 fewer trips through the optimizer's per-group loop per step
    constructor='GroupedOptimWrapperConstructor',
    # fused: one multi-tensor kernel per step instead of several per group of
    # tensors (DinoVim-B has ~375 parameter tensors; same update rule)
    optimizer=dict(type='AdamW', lr=5e-4 * (48 * 4) / 256, betas=(0.9, 0.999),
                   weight_decay=0.04, fused=True),
    clip_grad=dict(max_norm=3.0),
    # biases, norm weights, A_log, D, dt_bias: no weight decay (as the official
    # code: every parameter with one dimension)
    paramwise_cfg=dict(flat_decay_mult=0.0))
# the lr above is for 48 images/GPU x 4 GPUs; --auto-scale-lr rescales it to the
# real batch size
auto_scale_lr = dict(base_batch_size=48 * 4, enable=False)

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=90, eta_min=1e-6, by_epoch=True, begin=10,
         end=100, convert_to_iter_based=True),
    # eta_min_ratio: 0.4 / 0.04 for decayed groups; groups without decay stay at 0
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay',
         eta_min_ratio=10.0, by_epoch=True, begin=0, end=100,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=100)

custom_hooks = [
    dict(type='DINOTeacherMomentumHook', base_momentum=0.996, final_momentum=1.0),
    dict(type='DINOTeacherTempHook', final_temp=0.04, warmup_temp=0.04,
         warmup_epochs=0),
    dict(type='DINOFreezeLastLayerHook', freeze_epochs=1),
]
