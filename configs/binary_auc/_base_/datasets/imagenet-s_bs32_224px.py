# Binary-AUC on the ImageNet-S validation set (ImageNetS919: 12419 images with
# label maps; id = R + 256 * G, 0 background, 1000 ignored). Each image is resized
# to 224 x 224 without cropping, so the whole label map is scored; label maps
# are loaded after the resize and keep their resolution (BinaryAUC resizes the
# activation map to them, bilinearly). The exact (rank) AUC is the default; the
# paper's sweep is `--cfg-options test_evaluator.thresholds=100`.
# Data root: --cfg-options test_dataloader.dataset.data_root=PATH
_base_ = '../../../_base_/default_runtime.py'

image_size = 224
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), interpolation='bicubic',
         backend='pillow'),
    dict(type='LoadRGBLabelMap'),
    dict(type='PackInputs', algorithm_keys=['gt_seg_map']),
]
test_dataloader = dict(
    batch_size=32,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='ImageNetS',
        data_root='data/ImageNetS/ImageNetS919',
        data_prefix=dict(img_path='validation',
                         seg_map_path='validation-segmentation'),
        pipeline=test_pipeline))
test_evaluator = dict(type='BinaryAUC', thresholds=None, background_indices=[0],
                      ignore_index=1000)
test_cfg = dict()
