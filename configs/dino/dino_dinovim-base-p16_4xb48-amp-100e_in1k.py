# DINO pretraining of DinoVim-B on ImageNet-1k, the official Dino-Mamba recipe:
# 4 GPUs x 48 images, fp16 AMP, 100 epochs, 2 global + 8 local crops, the blocks
# replayed from CUDA graphs. Paper: linear probe 78.1 top-1 (configs/linear_probe/).
_base_ = [
    '../_base_/models/dino_dinovim-base-p16.py',
    './_base_/dino_4xb48-amp-graph-blocks-100e_in1k.py',
]
