# Binary-AUC on the toy dataset (python tools/make_toy_data.py data/toy), read as
# ImageNet-S (masks/val/<class>/<image>.png): runs on a CPU in seconds.
#   python tools/test.py configs/binary_auc/binary-auc_dinovim-toy-p8_toy.py \
#       work_dirs/dino_dinovim-toy-p8_1xb8-10e_toy/epoch_10.pth
_base_ = [
    './_base_/models/activation-map_dinovim-toy-p8.py',
    './_base_/datasets/imagenet-s_bs32_224px.py',
]

image_size = 64
# the ImageNet-S pipeline at 64 px
test_pipeline = [
    dict(t, scale=(image_size, image_size)) if t.type == 'Resize' else dict(t)
    for t in _base_.test_pipeline
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
