# UperNet for a plain patch-16 backbone, 512 x 512 crops, 150 ADE20K classes:
# the model of the MAE/BEiT fine-tuning protocol on mmseg's UperNet-ViT-B.
# The backbone gives four 1/16 maps (the last block of each quarter) and mmseg's
# Feature2Pyramid turns them into 1/4, 1/8, 1/16 and 1/32 (two 2x deconvolutions,
# one, identity, 2x max-pool); the auxiliary FCN head reads the third map; the
# test is a sliding window. The backbone is a DINO-pretrained DinoVim-B (24
# bidirectional Mamba-2 blocks, 768 wide); the other backbones' model files are
# deltas on this one.
_base_ = 'mmseg::_base_/models/upernet_vit-b16_ln_mln.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    data_preprocessor=dict(size=(512, 512)),
    pretrained=None,  # backbones load their weights through init_cfg
    backbone=dict(
        _delete_=True,
        type='DinoVim',
        arch='base',
        img_size=512,
        out_type='featmap',
        out_indices=[5, 11, 17, 23],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/dinovim-base-p16_dino-in1k.pth')),
    neck=dict(
        _delete_=True,
        type='Feature2Pyramid',
        embed_dim=768,
        rescales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[768, 768, 768, 768], channels=768,
                     num_classes=150),
    auxiliary_head=dict(in_channels=768, in_index=2, num_classes=150),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))
