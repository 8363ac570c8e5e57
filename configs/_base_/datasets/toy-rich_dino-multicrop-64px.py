# The rich toy data (shape-and-texture classes in random colours on cluttered
# backgrounds, 64 px; tools/make_toy_data.py --style rich, or the recipes of
# tools/run_demo.py and tools/run_comparison.py, which write it) for DINO: 2 global
# 64 px crops and 4 local 32 px ones per image. DINO's blur radius range (0.1, 2) px
# is set for 224 px crops; scaled by 64 / 224 it keeps the few-pixel textures that
# carry half of each class (the full range wipes them out).
_base_ = './imagenet_bs48_dino-multicrop.py'

data_root = 'data/toy'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='DINOMultiCrop', global_size=64, local_size=32, num_local_views=4,
         blur_radius=(0.03, 0.57)),
    dict(type='PackInputs'),
]
train_dataloader = dict(dataset=dict(data_root=data_root, pipeline=train_pipeline))
