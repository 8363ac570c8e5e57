# DinoVim-T in mmdet's own Mask R-CNN recipe (COCO, 1x): an upstream config this
# project does not ship, with our backbone dropped in.
# See docs/dense_prediction.md, "Use DinoVim in your own mmseg / mmdet config".
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,  # ResNet's arguments do not apply to DinoVim
        type='DinoVim',
        arch='tiny',  # 24 blocks, 256 wide
        out_type='featmap',  # (batch, 256, H / 16, W / 16) maps, not [CLS] vectors
        out_indices=[5, 11, 17, 23],  # the last block of each quarter
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/dinovim-tiny-p16_dino-in1k.pth')),
    # a list of necks is built as a Sequential: mmseg's Feature2Pyramid (by scope
    # prefix) makes 1/4 ... 1/32 maps of the four 1/16 ones, then mmdet's FPN
    neck=[
        dict(type='mmseg.Feature2Pyramid', embed_dim=256, rescales=[4, 2, 1, 0.5],
             norm_cfg=dict(type='SyncBN', requires_grad=True)),
        dict(type='FPN', in_channels=[256, 256, 256, 256], out_channels=256,
             num_outs=5),
    ])

# ResNet's SGD lr 0.02 diverges with this backbone; AdamW with layer-wise lr
# decay (0.7 per block of a 12-block backbone, normalised by depth) trains
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7, reference_num_layers=12))
