# UperNet on ADE20K (512 x 512, 160k iterations, 8 GPUs x 2 images) with a
# DINO-pretrained DinoVim-T (24 bidirectional Mamba-2 blocks, 256 wide).
_base_ = [
    './_base_/models/upernet_dinovim-tiny-p16.py',
    './_base_/upernet_8xb2-160k_ade20k-512x512.py',
]
