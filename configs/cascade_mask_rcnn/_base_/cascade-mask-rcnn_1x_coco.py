# COCO instances, 1x schedule (12 epochs, lr steps at 8 and 11), for the Cascade
# Mask R-CNN models of ./models/: mmdet's dataset, schedule and runtime with AdamW
# lr 1e-4, weight decay 0.05 and layer-wise lr decay 0.7 per block of a 12-block
# backbone (ViTDet's ViT-B value; asked of the backbone and normalised by its
# depth: the 24-block DinoVims decay by 0.7 ** (12 / 24) per block); 8 GPUs x 2
# images.
_base_ = [
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]

# The dataset (COCO 2017's layout: train2017/, val2017/ and
# annotations/instances_{train,val}2017.json) is read from $DATA_ROOT, default
# data/coco:   DATA_ROOT=/path/to/coco python tools/train.py CONFIG
data_root = '{{$DATA_ROOT:data/coco}}'.rstrip('/') + '/'
train_dataloader = dict(dataset=dict(data_root=data_root))
val_dataloader = dict(dataset=dict(data_root=data_root))
test_dataloader = dict(dataset=dict(data_root=data_root))
val_evaluator = dict(ann_file=data_root + _base_.val_dataloader.dataset.ann_file)
test_evaluator = dict(ann_file=data_root + _base_.test_dataloader.dataset.ann_file)
# checkpoints written atomically, with the RNG states for an exact --resume;
# training stopped at the first non-finite loss or gradient, before it is saved;
# one CPU thread without CUDA unless OMP_NUM_THREADS is set (CPUThreadsHook)
default_hooks = dict(checkpoint=dict(type='ResumableCheckpointHook'),
                     non_finite=dict(type='NonFiniteStopHook'),
                     cpu_threads=dict(type='CPUThreadsHook'))
# The backbones' blocks replay from CUDA graphs (CUDAGraphBlocksHook, per input
# size; a model without such blocks, ViT, runs eagerly). A run that only tests
# (tools/test.py: whole images, padded to many sizes) replays the no-grad forward
# of the sizes that recur, up to the hook's test bound, least recently used out.
# Off: --cfg-options custom_hooks=[]
custom_hooks = [dict(type='CUDAGraphBlocksHook', max_signatures=2)]

# 8 GPUs x 2 images = 16 = auto_scale_lr.base_batch_size (from schedule_1x)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7, reference_num_layers=12))
