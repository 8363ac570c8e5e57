# MLLA-T on the toy data (python tools/make_toy_data.py data/toy; --style rich
# works too): the MLLA-T classifier and MLLA's schedule shrunk to run on a CPU in
# about a minute, with no --cfg-options: 64 px crops (a 2 x 2 grid after the
# four stages), the toy dataset's 4 classes (its classes.txt), 5 epochs of 4
# batches of 16, one warm-up epoch, top-1 only (top-5 needs 5 classes).
# Composed of fragments: MLLA-T, toy data, MLLA schedule, runtime.
_base_ = [
    './_base_/models/mlla-tiny.py',
    '../_base_/datasets/toy-rich_linear-probe-64px.py',
    './_base_/schedules/mlla_adamw-300e_bs4096.py',
    '../_base_/default_runtime.py',
]

num_classes = 4
max_epochs = 5
batch_size = 16
model = dict(
    backbone=dict(img_size=64),
    head=dict(num_classes=num_classes),
    # no Mixup / CutMix: 20 iterations learn nothing through mixed labels
    train_cfg=None)
data_preprocessor = dict(num_classes=num_classes)

train_dataloader = dict(batch_size=batch_size, num_workers=1,
                        persistent_workers=False)
val_dataloader = dict(batch_size=batch_size, num_workers=1, persistent_workers=False)
test_dataloader = val_dataloader

# the official base lr without its batch scaling (5e-4 * 16 / 512 would not move
# in 20 iterations)
optim_wrapper = dict(optimizer=dict(lr=5e-4))
auto_scale_lr = dict(base_batch_size=batch_size)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=1,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
# no model EMA: at 0.9996 per step the EMA of 20 steps is the initialisation
custom_hooks = []

env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=2),
    checkpoint=dict(type='ResumableCheckpointHook', interval=max_epochs,
                    max_keep_ckpts=1))
