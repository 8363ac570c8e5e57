# UperNet for a hierarchical backbone (mmseg's Swin UperNet: the four stages at 1/4,
# 1/8, 1/16 and 1/32 straight into UPerHead, an FCN auxiliary head on the third,
# 150 ADE20K classes, 512 x 512 crops, whole-image test) with an ImageNet-1k MLLA-T,
# as the official ADE20K setting (github LeapLabTHU/MLLA,
# downstream/segmentation/configs/mlla/mlla_b_upernet.py). The official setting
# exists for MLLA-B only (drop path 0.5, its classification rate); T and S take
# their classification rates too (0.2, 0.3). The backbone starts from the official
# classification weights, converted on load: download them to checkpoints/ as
# docs/mlla.md shows. The other MLLA model files are deltas on this one.
_base_ = 'mmseg::_base_/models/upernet_swin.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    data_preprocessor=dict(size=(512, 512)),
    backbone=dict(
        _delete_=True,
        type='MLLA',
        arch='tiny',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/mlla-tiny_in1k.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))
