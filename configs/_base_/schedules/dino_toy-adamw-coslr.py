# DINO's schedule (dino_adamw-coslr-100e.py: AdamW, linear warm-up, cosine lr to
# 1e-6, weight decay 0.04 -> 0.4, per-tensor clipping) for short toy runs, in
# float32 (AMP needs a GPU): one warm-up epoch, and the two cosines end with the
# run. They have no `end` (mmengine ends a scheduler without one with the run)
# and no `T_max` (a cosine then spans its epochs), so `train_cfg.max_epochs` alone
# sets the run's length.
_base_ = './dino_adamw-coslr-100e.py'

optim_wrapper = dict(type='PerParamClipOptimWrapper')
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=1,
         convert_to_iter_based=True),
    # eta_min_ratio: 0.4 / 0.04 for decayed groups; groups without decay stay at 0
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay',
         eta_min_ratio=10.0, by_epoch=True, begin=0, convert_to_iter_based=True),
]
