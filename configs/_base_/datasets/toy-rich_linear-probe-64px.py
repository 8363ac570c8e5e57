# The rich toy data for a linear probe at 64 px: random resized crops and flips to
# train, the 64 px images as they are to test, the classes of the dataset's
# classes.txt; top-1 only (a toy set may have fewer than 5 classes).
_base_ = './imagenet_bs128_linear-probe.py'

data_root = 'data/toy'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, backend='pillow'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64)),
    dict(type='PackInputs'),
]
toy_dataset = dict(data_root=data_root, classes=f'{data_root}/classes.txt')
train_dataloader = dict(dataset=dict(pipeline=train_pipeline, **toy_dataset))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline, **toy_dataset))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator
