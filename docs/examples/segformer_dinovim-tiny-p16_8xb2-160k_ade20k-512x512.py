# DinoVim-T in mmseg's own SegFormer recipe (ADE20K, 512 x 512, 160k iterations):
# an upstream config this project does not ship, with our backbone dropped in.
# See docs/dense_prediction.md, "Use DinoVim in your own mmseg / mmdet config".
_base_ = 'mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,  # MiT's arguments do not apply to DinoVim
        type='DinoVim',
        arch='tiny',  # 24 blocks, 256 wide
        img_size=512,  # the training crop: the position embedding's grid
        out_type='featmap',  # (batch, 256, H / 16, W / 16) maps; the default
        # out_type='cls_token' gives (batch, 256) vectors, which no head can use
        out_indices=[5, 11, 17, 23],  # the last block of each quarter
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/dinovim-tiny-p16_dino-in1k.pth')),
    # the four 1/16 maps become 1/4, 1/8, 1/16 and 1/32, as SegFormer's head expects
    neck=dict(type='Feature2Pyramid', embed_dim=256, rescales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[256, 256, 256, 256]))

# MiT's custom_keys name MiT's modules; AdamW with layer-wise lr decay asked of
# the backbone instead (0.65 per block of a 12-block backbone, normalised by depth)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.65, reference_num_layers=12))
