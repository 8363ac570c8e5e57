# The recipe of dino_4xb48-amp-100e_in1k.py for DinoVim backbones: both backbones'
# 24 blocks replayed from CUDA graphs, one capture per crop size during the first
# iteration (an eager step is otherwise bound by the host's Python). Same kernels,
# same numbers; on a CPU the blocks run eagerly. Plain eager: the same leaf on
# dino_4xb48-amp-100e_in1k.py, or --cfg-options "custom_hooks=[...]" without it.
_base_ = './dino_4xb48-amp-100e_in1k.py'

custom_hooks = _base_.custom_hooks + [dict(type='CUDAGraphBlocksHook')]
