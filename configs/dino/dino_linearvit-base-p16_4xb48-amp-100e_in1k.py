# DINO pretraining of LinearViT-B (ViT-B with linear attention), the paper's
# linear-attention baseline. Paper: linear probe 74.7.
_base_ = './dino_dinovim-base-p16_4xb48-amp-100e_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='LinearViT',
        arch='base',
        img_size=224,
        patch_size=16,
        out_type='cls_token',
        drop_path_rate=0.1))
