# UperNet + DINO-pretrained ViT-B/16 (mmpretrain's VisionTransformer, softmax
# attention).
_base_ = './_base_/upernet_plain-p16_8xb2-160k_ade20k-512x512.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.VisionTransformer',
        arch='base',
        img_size=512,
        patch_size=16,
        out_type='featmap',
        out_indices=[2, 5, 8, 11],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-base-p16_dino-in1k.pth')))
