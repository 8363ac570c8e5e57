# The small comparison recipe's shared part: DINO on the rich toy data (12
# shape-and-texture classes in random colours on cluttered backgrounds, 64 px;
# tools/run_comparison.py generates them) for one GPU, composed of the toy data and
# schedule fragments of the CPU demo (dino_dinovim-toy-p8_1xb8-10e_toy.py) at a
# larger budget. Every model config swaps `model.backbone` only, so the mixers
# get the same data, crops, head, schedule and budget. The run's length is
# `train_cfg.max_epochs` (tools/run_comparison.py --epochs E sets it, and the
# warm-up, by name).
_base_ = [
    '../../_base_/models/dino_dinovim-base-p16.py',
    '../../_base_/datasets/toy-rich_dino-multicrop-64px.py',
    '../../_base_/schedules/dino_toy-adamw-coslr.py',
    '../../_base_/default_runtime.py',
    './backbones_d192-l12-p8.py',
]

data_root = 'data/toy_rich_compare'
embed_dims = 192
num_layers = 12
out_channels = 4096
batch_size = 128
max_epochs = 20
warmup_epochs = 2

model = dict(
    # BatchNorm in the head, as in the CPU demo: toy images start with nearly
    # parallel features
    head=dict(in_channels=embed_dims, out_channels=out_channels, hidden_channels=1024,
              bottleneck_channels=128, use_bn=True),
    loss=dict(out_channels=out_channels),
    teacher_momentum=0.99)

# 6 local crops instead of 4
train_pipeline = [
    dict(t, num_local_views=6) if t.type == 'DINOMultiCrop' else t
    for t in _base_.train_pipeline
]
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=12,
    dataset=dict(data_root=data_root, pipeline=train_pipeline))

# one GPU, fp16 AMP (tools/run_comparison.py --device cpu trains in float32)
optim_wrapper = dict(type='PerParamClipAmpOptimWrapper',
                     optimizer=dict(lr=5e-4 * batch_size / 256))
auto_scale_lr = dict(base_batch_size=batch_size)
# two warm-up epochs: the warm-up ends, and the cosine of the lr begins, there
param_scheduler = [
    dict(s, end=warmup_epochs) if s.type == 'LinearLR' else
    dict(s, begin=warmup_epochs) if s.type == 'CosineAnnealingLR' else s
    for s in _base_.param_scheduler
]
train_cfg = dict(max_epochs=max_epochs)
knn_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64)),
    dict(type='PackInputs'),
]
knn_bank = dict(
    batch_size=256,
    num_workers=4,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='CustomDataset', data_root=data_root, ann_file='meta/train.txt',
                 data_prefix='train', pipeline=knn_pipeline))
knn_query = dict(knn_bank, dataset=dict(knn_bank['dataset'], ann_file='meta/val.txt',
                                        data_prefix='val'))
# about 940 steps: the paper's 0.996 would leave the teacher near its init
custom_hooks = [
    dict(type='DINOTeacherMomentumHook', base_momentum=0.99, final_momentum=1.0),
    dict(type='DINOTeacherTempHook', final_temp=0.04, warmup_temp=0.04,
         warmup_epochs=0),
    dict(type='DINOFreezeLastLayerHook', freeze_epochs=1),
    # k-NN of the teacher's readout (the training images as the bank, the held-out
    # ones as queries) before the first step (random init) and every 10 epochs;
    # tools/run_comparison.py points both at its data root
    dict(type='KNNMonitorHook', bank_dataloader=knn_bank, query_dataloader=knn_query,
         interval=10),
    # <work_dir>/init.pth: the weights the run starts from, the comparison's
    # "random init" rows (tools/run_comparison.py)
    dict(type='InitialWeightsHook'),
]
randomness = dict(seed=0)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(interval=10, max_keep_ckpts=1, save_last=True))
