# The official MLLA schedule (paper App. A; github LeapLabTHU/MLLA config.py and
# main.py): 300 epochs of AdamW (weight decay 0.05, none on norms, biases and other
# 1-D parameters), gradient clipping at 5, 20 linear warm-up epochs, then cosine.
# The official code scales base 5e-4, warm-up 5e-7 and minimum 5e-6 by
# batch / 512; the paper trains with 4096 images per step.
_base_ = 'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py'

optim_wrapper = dict(
    optimizer=dict(lr=5e-4 * 4096 / 512),
    clip_grad=dict(max_norm=5.0))

param_scheduler = [
    # 5e-7 * 4096 / 512 at the start = lr * 1e-3
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=5e-6 * 4096 / 512, by_epoch=True,
         begin=20, convert_to_iter_based=True),
]

# the lr above is for 4096 images per step (e.g. 32 GPUs x 128)
auto_scale_lr = dict(base_batch_size=4096)

# Model EMA (the official --model-ema, on by default): decay 0.9996 per step at
# batch 4096; mmengine's momentum is the weight of the new value, 1 - decay.
# The EMA weights are the ones validated and saved.
custom_hooks = [dict(type='EMAHook', momentum=1 - 0.9996, priority='ABOVE_NORMAL')]
