# DINO pretraining of ViT-B/16 (mmpretrain's VisionTransformer, softmax
# attention), the paper's softmax baseline. Paper: linear probe 78.2.
_base_ = './dino_dinovim-base-p16_4xb48-amp-100e_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.VisionTransformer',
        arch='base',
        img_size=224,
        patch_size=16,
        out_type='cls_token',
        drop_path_rate=0.1,
        init_cfg=[
            dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
            dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
        ]))
