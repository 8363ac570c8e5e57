# The small comparison recipe's linear probe: a frozen backbone of a
# configs/compare/ DINO run (its teacher, or the run's init.pth), the [CLS]
# readouts of its last 4 blocks concatenated, one linear layer, trained on the
# rich toy training split and tested on the held-out split at 64 px (the k-NN's
# and the comparison report's view of the images). The probe chain of the paper's
# ImageNet probes (ImageClassifier, ConcatNeck, LinearClsHead, SGD with a cosine
# lr) on the toy data and schedule fragments; tools/run_comparison.py trains one
# per model and points `model.backbone.init_cfg.checkpoint` and the data root at
# its run (an extracted teacher needs `model.backbone.init_cfg.prefix=None`).
_base_ = [
    '../../_base_/models/linear-probe_dinovim-base-p16.py',
    '../../_base_/datasets/toy-rich_linear-probe-64px.py',
    '../../_base_/schedules/linear-probe_toy-sgd-coslr.py',
    '../../_base_/default_runtime.py',
    './backbones_d192-l12-p8.py',
]

data_root = 'data/toy_rich_compare'
embed_dims = 192
num_blocks = 4
num_classes = 12
batch_size = 128
max_epochs = 30
# what each probe adds to its DINO config's backbone (_base_/backbones_*.py):
# frozen, the last blocks read out (`**probe_backbone`), weights from the run's
# teacher (`init_cfg`, whose checkpoint the probe names), every tensor of the
# backbone with its shape (strict: also for mmpretrain's ViT, which mmengine
# would load partially)
probe_backbone = dict(out_indices=list(range(-num_blocks, 0)), frozen_stages=12)
probe_init_cfg = dict(type='Pretrained', prefix='teacher.backbone.', strict=True)
model = dict(
    # the ImageNet probe's DinoVim-B gives way to the probe's own backbone
    backbone=dict(_delete_=True, init_cfg=probe_init_cfg),
    neck=dict(in_channels=embed_dims * num_blocks),
    head=dict(num_classes=num_classes, in_channels=embed_dims * num_blocks))
data_preprocessor = dict(num_classes=num_classes)

toy_dataset = dict(data_root=data_root, classes=f'{data_root}/classes.txt')
train_dataloader = dict(batch_size=batch_size, num_workers=4, dataset=toy_dataset)
val_dataloader = dict(batch_size=batch_size, num_workers=4, dataset=toy_dataset)
test_dataloader = val_dataloader

# the lr is set for unit-scale readouts and ~1400 steps, not DINO's 100 ImageNet
# epochs
optim_wrapper = dict(optimizer=dict(lr=0.05))
auto_scale_lr = dict(base_batch_size=batch_size)
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='ResumableCheckpointHook', interval=max_epochs,
                    max_keep_ckpts=1))
