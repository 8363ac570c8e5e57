# MLLA-T classifier: MLLA backbone, global average pooling, linear head; label
# smoothing 0.1 and Mixup 0.8 / CutMix 1.0 (one of the two per batch, switch
# probability 0.5), as the official recipe (github LeapLabTHU/MLLA, config.py).
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='MLLA', arch='tiny', img_size=224, drop_path_rate=0.2,
                  out_indices=(3, )),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=512,
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.),
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8),
                             dict(type='CutMix', alpha=1.0)]),
)
