# UperNet on ADE20K, 512x512 crops, 160k iterations, for plain patch-16 backbones.
#
# The MAE/BEiT fine-tuning protocol: the backbone gives four 1/16 maps (the last
# block of each quarter), mmseg's Feature2Pyramid turns them into 1/4, 1/8, 1/16
# and 1/32 (two 2x deconvolutions, one, identity, 2x max-pool); AdamW lr 1e-4,
# weight decay 0.05, layer-wise lr decay asked of the backbone, 1500 warm-up
# iterations then linear decay; 8 GPUs x 2 images; sliding-window test.
# A backbone config swaps `model.backbone` (with `_delete_=True`), points its
# `init_cfg` at a DINO-pretrained backbone and, if it is not 768 wide, sets the
# channels of the neck and heads.
_base_ = [
    'mmseg::_base_/models/upernet_vit-b16_ln_mln.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='ResumableCheckpointHook'))  # exact resume

crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,  # backbones load their weights through init_cfg
    neck=dict(
        _delete_=True,
        type='Feature2Pyramid',
        embed_dim=768,
        rescales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[768, 768, 768, 768], channels=768,
                     num_classes=150),
    auxiliary_head=dict(in_channels=768, in_index=2, num_classes=150),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))

# 8 GPUs x 2 images = 16 = auto_scale_lr.base_batch_size
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.65))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500,
         end=160000),
]
