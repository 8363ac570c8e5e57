# The small comparison recipe's linear probe: a frozen backbone of a
# configs/compare/ DINO run (its teacher, or the run's init.pth), the [CLS]
# readouts of its last 4 blocks concatenated, one linear layer, trained on the
# rich toy training split and tested on the held-out split. The probe chain of
# the paper's ImageNet probes (ImageClassifier, ConcatNeck, LinearClsHead, SGD
# with a cosine lr) on the 64 px toy images; tools/run_comparison.py trains one
# per model and points `model.backbone.init_cfg.checkpoint` and the data root at
# its run (an extracted teacher needs `model.backbone.init_cfg.prefix=None`).
_base_ = '../../linear_probe/dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

data_root = 'data/toy_rich_compare'
embed_dims = 192
num_blocks = 4
num_classes = 12
batch_size = 128
max_epochs = 30
# what each probe adds to its DINO config's backbone (_base_/backbones_*.py):
# frozen, the last blocks read out, weights from the run's teacher
# (`init_cfg=dict(probe_init_cfg, checkpoint=...)`)
probe_backbone = dict(out_indices=list(range(-num_blocks, 0)), frozen_stages=12)
probe_init_cfg = dict(type='Pretrained', prefix='teacher.backbone.')
model = dict(
    neck=dict(in_channels=embed_dims * num_blocks),
    head=dict(num_classes=num_classes, in_channels=embed_dims * num_blocks))
data_preprocessor = dict(num_classes=num_classes)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, backend='pillow'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
# the images are 64 px: the k-NN's and the comparison tool's view of them
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64)),
    dict(type='PackInputs'),
]
toy_dataset = dict(data_root=data_root, classes=f'{data_root}/classes.txt')
train_dataloader = dict(batch_size=batch_size, num_workers=4,
                        dataset=dict(pipeline=train_pipeline, **toy_dataset))
val_dataloader = dict(batch_size=batch_size, num_workers=4,
                      dataset=dict(pipeline=test_pipeline, **toy_dataset))
test_dataloader = val_dataloader

# SGD, momentum 0.9, no weight decay, cosine to 0 over the run; the lr is set
# for unit-scale readouts and ~1400 steps, not DINO's 100 ImageNet epochs
optim_wrapper = dict(optimizer=dict(lr=0.05, weight_decay=0.0))
auto_scale_lr = dict(base_batch_size=batch_size)
param_scheduler = [
    dict(type='CosineAnnealingLR', T_max=max_epochs, by_epoch=True, begin=0,
         end=max_epochs)
]
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='ResumableCheckpointHook', interval=max_epochs,
                    max_keep_ckpts=1))
