# Cascade Mask R-CNN (mmdet's, 80 COCO classes) for a plain patch-16 backbone.
# The backbone gives four 1/16 maps (the last block of each quarter); mmseg's
# Feature2Pyramid, reached by scope prefix, rescales them to 1/4, 1/8, 1/16 and
# 1/32, and mmdet's FPN adds the top-down path and P6. mmdet's data preprocessor
# pads every batch to a multiple of 32, so the 1/16 grid is exact and the
# position embeddings interpolate to any input size (1333x800 and beyond).
# The backbone is a DINO-pretrained DinoVim-B (24 bidirectional Mamba-2 blocks,
# 768 wide); the other backbones' model files are deltas on this one.
_base_ = 'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='DinoVim',
        arch='base',
        out_type='featmap',
        out_indices=[5, 11, 17, 23],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/dinovim-base-p16_dino-in1k.pth')),
    neck=[
        dict(
            type='mmseg.Feature2Pyramid',
            embed_dim=768,
            rescales=[4, 2, 1, 0.5],
            norm_cfg=dict(type='SyncBN', requires_grad=True)),
        dict(
            type='FPN',
            in_channels=[768, 768, 768, 768],
            out_channels=256,
            num_outs=5),
    ])
