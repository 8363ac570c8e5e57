# ADE20K 512 x 512, 160k iterations, 8 GPUs x 2 images, with the Swin UperNet
# recipe that MLLA's official ADE20K config uses: the data, runtime and schedule of
# ./upernet_8xb2-160k_ade20k-512x512.py (1500 linear warm-up iterations from
# lr * 1e-6, then poly to 0), with AdamW lr 6e-5, betas (0.9, 0.999), weight decay
# 0.01 and none on norms (BatchNorm and LayerNorm), without layer-wise lr decay.
_base_ = './upernet_8xb2-160k_ade20k-512x512.py'

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))
