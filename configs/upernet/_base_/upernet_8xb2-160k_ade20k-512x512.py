# ADE20K 512 x 512, 160k iterations, for the UperNet models of ./models/: mmseg's
# dataset, runtime and schedule, changed to the MAE/BEiT fine-tuning recipe:
# AdamW lr 1e-4, weight decay 0.05, layer-wise lr decay 0.65 per block of a
# 12-block backbone (asked of the backbone and normalised by its depth: the
# 24-block DinoVims decay by 0.65 ** (12 / 24) per block), 1500 warm-up
# iterations then linear decay; 8 GPUs x 2 images.
_base_ = [
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]

# The dataset (ADEChallengeData2016's layout: images/ and annotations/, each with
# training/ and validation/) is read from $DATA_ROOT, default data/ade/...:
#   DATA_ROOT=/path/to/ADEChallengeData2016 python tools/train.py CONFIG
data_root = '{{$DATA_ROOT:data/ade/ADEChallengeData2016}}'
# 8 GPUs x 2 images = 16 = auto_scale_lr.base_batch_size
train_dataloader = dict(batch_size=2, dataset=dict(data_root=data_root))
val_dataloader = dict(dataset=dict(data_root=data_root))
test_dataloader = dict(dataset=dict(data_root=data_root))
auto_scale_lr = dict(enable=False, base_batch_size=16)
# checkpoints written atomically, with the RNG states for an exact --resume;
# training stopped at the first non-finite loss or gradient, before it is saved;
# one CPU thread without CUDA unless OMP_NUM_THREADS is set (CPUThreadsHook)
default_hooks = dict(checkpoint=dict(type='ResumableCheckpointHook'),
                     non_finite=dict(type='NonFiniteStopHook'),
                     cpu_threads=dict(type='CPUThreadsHook'))
# The backbones' blocks replay from CUDA graphs (CUDAGraphBlocksHook, per input
# size; a model without such blocks, ViT, runs eagerly): MLLA's stages in training
# (one crop size; the whole-image validations add one no-grad capture per size,
# up to 4 in all), and in a run that only tests (tools/test.py) DinoVim's and MLLA's
# no-grad forward, up to the hook's test bound. Off: --cfg-options custom_hooks=[]
custom_hooks = [dict(type='CUDAGraphBlocksHook', max_signatures=4)]

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.65, reference_num_layers=12))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500,
         end=160000),
]
