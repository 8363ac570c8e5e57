# Binary-AUC on PASCAL VOC 2012 val through mmseg (default scope mmseg): its
# PascalVOCDataset and pipeline, label maps with 0 = background and 255 = object
# boundaries (ignored). Images are resized to 224 x 224 without cropping; label
# maps keep their resolution (loaded after the resize, as in mmseg's own test
# pipelines). Data root: --cfg-options test_dataloader.dataset.data_root=PATH
_base_ = [
    'mmseg::_base_/datasets/pascal_voc12.py',
    'mmseg::_base_/default_runtime.py',
]

image_size = 224
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=False),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
test_dataloader = dict(batch_size=32, dataset=dict(pipeline=test_pipeline))
test_evaluator = dict(_delete_=True, type='BinaryAUC', thresholds=None,
                      background_indices=[0], ignore_index=255)
test_cfg = dict(type='TestLoop')
# one CPU thread without CUDA unless OMP_NUM_THREADS is set
default_hooks = dict(cpu_threads=dict(type='CPUThreadsHook'))
# evaluation only: drop mmseg's training and validation loaders
train_dataloader = None
val_dataloader = None
val_evaluator = None
