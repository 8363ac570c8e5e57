# Binary-AUC on the toy dataset (python tools/make_toy_data.py data/toy), read as
# ImageNet-S (masks/val/<class>/<image>.png): runs on a CPU in seconds.
#   python tools/test.py configs/binary_auc/binary-auc_dinovim-toy-p8_toy.py \
#       work_dirs/dino_dinovim-toy-p8_1xb8-10e_toy/epoch_10.pth
_base_ = [
    './_base_/models/activation-map_dinovim-toy-p8.py',
    './_base_/datasets/imagenet-s_bs32_224px.py',
]

image_size = 64
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), interpolation='bicubic',
         backend='pillow'),
    dict(type='LoadRGBLabelMap'),
    dict(type='PackInputs', algorithm_keys=['gt_seg_map']),
]
test_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=False,
    dataset=dict(
        data_root='data/toy',
        data_prefix=dict(img_path='val', seg_map_path='masks/val'),
        ann_file='meta/val.txt',
        pipeline=test_pipeline))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
