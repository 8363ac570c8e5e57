# Binary-AUC on the toy dataset's ADE20K-style copy (data/toy/ade), through mmseg:
# BaseSegDataset with single-channel label maps, 0 = background, objects = class
# id + 1 (reduce_zero_label=False keeps the background as label 0).
_base_ = [
    './_base_/models/activation-map_dinovim-toy-p8.py',
    './_base_/datasets/voc12_bs32_224px.py',
]

image_size = 64
# decoded and resized by Pillow, as the ImageNet-S-style toy config
test_pipeline = [
    dict(type='LoadImageFromFile', imdecode_backend='pillow'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=False,
         interpolation='bicubic', backend='pillow'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
test_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=False,
    dataset=dict(
        _delete_=True,
        type='BaseSegDataset',
        data_root='data/toy/ade',
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        img_suffix='.jpg',
        seg_map_suffix='.png',
        reduce_zero_label=False,
        pipeline=test_pipeline))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
