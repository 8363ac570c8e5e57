# DINO on the rich toy dataset (tools/run_demo.py generates it; by hand:
# python tools/make_toy_data.py data/toy_rich --style rich --num-classes 4
#   --train-per-class 64 --val-per-class 64 --size 64 --formats imagenet):
# the toy DinoVim recipe (dino_dinovim-toy-p8_1xb8-10e_toy.py) on shape-and-texture
# classes in random colours on cluttered backgrounds, 6 epochs of 32 batches of 8.
# The values below were picked by measurement on the 2-core CPU machine
# (docs/dino.md, "The demo", lists the runs).
_base_ = './dino_dinovim-toy-p8_1xb8-10e_toy.py'

data_root = 'data/toy_rich'
batch_size = 8
max_epochs = 6


def _view(size, scale, blur_prob, solarize_prob):
    # DINO's view (datasets/transforms/dino_multicrop.py) with a strong colour
    # jitter (hue 0.5, saturation 0.8) and grayscale p=0.5: the toy classes are
    # shape and texture in random colours, and colour is the shortcut that lets
    # two crops of one image agree without seeing either
    return [
        dict(type='mmpretrain.RandomResizedCrop', scale=size, crop_ratio_range=scale,
             interpolation='bicubic', backend='pillow'),
        dict(type='mmpretrain.RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='RandomApply', prob=0.8, transforms=[
            dict(type='mmpretrain.HueSafeColorJitter', brightness=0.4,
                 contrast=0.4, saturation=0.8, hue=0.5)]),
        dict(type='mmpretrain.RandomGrayscale', prob=0.5, keep_channels=True,
             channel_weights=(0.114, 0.587, 0.2989)),
        dict(type='mmpretrain.GaussianBlur', magnitude_range=(0.1, 2.0),
             magnitude_std='inf', prob=blur_prob),
    ] + ([dict(type='mmpretrain.Solarize', thr=128, prob=solarize_prob)]
         if solarize_prob else [])


train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='MultiView', num_views=[1, 1, 4],
         transforms=[_view(64, (0.5, 1.0), 1.0, 0.0), _view(64, (0.5, 1.0), 0.1, 0.2),
                     _view(32, (0.2, 0.5), 0.5, 0.0)]),
    dict(type='PackInputs'),
]
# larger crops than DINO's (0.4-1 and 0.05-0.4 of the area): on 64 px images the
# main object covers a third of the image, and smaller local crops see mostly the
# background mosaic
train_dataloader = dict(batch_size=batch_size,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
# 4x the toy recipe's lr: 192 iterations
optim_wrapper = dict(optimizer=dict(lr=2e-3))
auto_scale_lr = dict(base_batch_size=batch_size)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - 1, eta_min=1e-6, by_epoch=True,
         begin=1, end=max_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay',
         eta_min_ratio=10.0, by_epoch=True, begin=0, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=max_epochs,
                                     max_keep_ckpts=1))
