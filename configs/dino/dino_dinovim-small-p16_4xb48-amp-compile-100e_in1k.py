# DINO pretraining of DinoVim-Small with both backbones compiled (CUDA graphs); see
# dino_dinovim-base-p16_4xb48-amp-compile-100e_in1k.py.
_base_ = './dino_dinovim-small-p16_4xb48-amp-100e_in1k.py'

custom_hooks = _base_.custom_hooks + [
    dict(type='CompileModulesHook', modules=['backbone', 'teacher.backbone'],
         mode='reduce-overhead', dynamic=False),
]
