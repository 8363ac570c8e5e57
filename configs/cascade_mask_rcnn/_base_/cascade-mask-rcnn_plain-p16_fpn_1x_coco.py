# Cascade Mask R-CNN on COCO, 1x schedule, for plain patch-16 backbones.
#
# The backbone gives four 1/16 maps (the last block of each quarter); mmseg's
# Feature2Pyramid, reached by scope prefix, rescales them to 1/4, 1/8, 1/16 and
# 1/32, and mmdet's FPN adds the top-down path and P6. mmdet's data preprocessor
# pads every batch to a multiple of 32, so the 1/16 grid is exact and the
# position embeddings interpolate to any input size (1333x800 and beyond).
# AdamW lr 1e-4, weight decay 0.05, layer-wise lr decay 0.7 (ViTDet's ViT-B
# value) asked of the backbone; 8 GPUs x 2 images.
# A backbone config swaps `model.backbone` (with `_delete_=True`) and points its
# `init_cfg` at a DINO-pretrained backbone; one that is not 768 wide restates
# the neck list with its width.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='ResumableCheckpointHook'))  # exact resume

model = dict(
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

# 8 GPUs x 2 images = 16 = auto_scale_lr.base_batch_size (from schedule_1x)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7))
