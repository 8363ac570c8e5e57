# The 1x recipe trained 3x as long: 36 epochs, lr steps at 27 and 33 (the official
# MLLA 3x configs).
_base_ = './mask-rcnn_adamw_ms-crop-1x_coco.py'

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True,
         milestones=[27, 33], gamma=0.1),
]
