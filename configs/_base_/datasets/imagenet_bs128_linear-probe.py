# ImageNet-1k for DINO's linear probe: random resized crop 224 + flip for
# training; resize the short side to 256 (bicubic) and centre-crop 224 to test.
_base_ = 'mmpretrain::_base_/datasets/imagenet_bs32_pil_resize.py'

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', interpolation='bicubic',
         backend='pillow'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=128, num_workers=10)
val_dataloader = dict(batch_size=128, num_workers=10,
                      dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
