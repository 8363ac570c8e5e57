# ImageNet-1k (or any image folder) for DINO: 2 global crops (224 px, area 0.4-1)
# and 8 local crops (96 px, area 0.05-0.4) per image, see DINOMultiCrop.
dataset_type = 'ImageNet'
data_root = 'data/imagenet'
data_preprocessor = dict(
    type='SelfSupDataPreprocessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='DINOMultiCrop', global_size=224, local_size=96, num_local_views=8),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=48,
    num_workers=10,
    persistent_workers=True,
    pin_memory=True,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        split='train',
        pipeline=train_pipeline))
