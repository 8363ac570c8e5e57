# UperNet + DINO-pretrained LinearViT-B (ViT-B with linear attention, 12 blocks).
_base_ = './_base_/upernet_plain-p16_8xb2-160k_ade20k-512x512.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='LinearViT',
        arch='base',
        img_size=512,
        out_type='featmap',
        out_indices=[2, 5, 8, 11],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/linearvit-base-p16_dino-in1k.pth')))
