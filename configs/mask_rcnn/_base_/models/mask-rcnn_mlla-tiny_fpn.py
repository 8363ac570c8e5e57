# Mask R-CNN (mmdet's R-50-FPN model, 80 COCO classes) with an ImageNet-1k MLLA-T
# in place of the ResNet: a plain FPN over MLLA's four stages (1/4 ... 1/32,
# 64-128-256-512 channels), drop path 0.1, as the official COCO 1x setting (github
# LeapLabTHU/MLLA, downstream/detection/configs/mlla/mlla_t_mrcnn_1x.py). The
# backbone starts from the official classification weights, converted on load:
# download them to checkpoints/ as docs/mlla.md shows. The other MLLA model files
# are deltas on this one.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='MLLA',
        arch='tiny',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/mlla-tiny_in1k.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))
