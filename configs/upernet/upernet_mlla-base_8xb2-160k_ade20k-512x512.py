# UperNet on ADE20K (512 x 512, 160k iterations, 8 GPUs x 2 images) with an
# ImageNet-1k MLLA-B, in the Swin recipe of MLLA's official ADE20K config.
_base_ = [
    './_base_/models/upernet_mlla-base.py',
    './_base_/upernet-swin-recipe_8xb2-160k_ade20k-512x512.py',
]
