# COCO instances, 1x schedule (12 epochs, lr steps at 8 and 11, 500 linear warm-up
# iterations), 8 GPUs x 2 images, with the recipe of MLLA's official Mask R-CNN
# configs (Swin's): AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05 and none
# on norms, no layer-wise lr decay, and the DETR / Sparse R-CNN augmentation,
# which the official configs use for 1x and 3x alike: a horizontal flip, then
# either a resize to a shorter side drawn from 480 ... 800 (long side <= 1333),
# or a resize to a shorter side of 400, 500 or 600, a random crop of 384 ... 600 px
# and that resize. Data, evaluation and runtime are those of the Cascade Mask
# R-CNN recipe ($DATA_ROOT, default data/coco).
_base_ = '../../cascade_mask_rcnn/_base_/cascade-mask-rcnn_1x_coco.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))

short_sides = [480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=[(1333, s) for s in short_sides],
                  keep_ratio=True)],
            [dict(type='RandomChoiceResize', scales=[(1333, 400), (1333, 500),
                                                     (1333, 600)], keep_ratio=True),
             dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                  allow_negative_crop=True),
             dict(type='RandomChoiceResize', scales=[(1333, s) for s in short_sides],
                  keep_ratio=True)],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

# MLLA's stages replay from CUDA graphs (CUDAGraphBlocksHook, per input size: the multi-scale crops vary
# the size batch to batch: each training capture holds a step's activations, so
# two sizes are captured and the others run eagerly).
custom_hooks = [dict(type='CUDAGraphBlocksHook', max_signatures=2)]
