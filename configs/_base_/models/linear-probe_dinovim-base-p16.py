# Linear probe of a DINO-pretrained DinoVim-B: the backbone is frozen, the
# readouts of the last 8 blocks (RMSNorm_f of each block's mixer output at the
# [CLS] position, the official per-layer readout) are concatenated and fed to one
# linear layer. By default the backbone is the TEACHER of the pretraining run's
# last checkpoint; point `model.backbone.init_cfg.checkpoint` elsewhere with
# --cfg-options (for a file from tools/model_converters/extract_teacher.py also
# set `model.backbone.init_cfg.prefix=None`).
_base_ = './dinovim-base-p16.py'

num_blocks = 8  # n, the number of last blocks read out
model = dict(
    type='ImageClassifier',
    backbone=dict(
        out_indices=list(range(-num_blocks, 0)),
        out_type='cls_token',
        feature_source='mixer',
        frozen_stages=24,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/dino_dinovim-base-p16_4xb48-amp-100e_in1k/'
            'epoch_100.pth',
            prefix='teacher.backbone.')),
    neck=dict(type='ConcatNeck', in_channels=768 * num_blocks),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=768 * num_blocks,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
        init_cfg=dict(type='Normal', layer='Linear', std=0.01)))
