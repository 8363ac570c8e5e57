# DINO pretraining of DinoVim-B as dino_dinovim-base-p16_4xb48-amp-100e_in1k.py, with
# both backbones (student and teacher) under torch.compile and CUDA graphs: the
# fused mixer runs as custom ops inside the graph, and each step's launches are
# replayed instead of issued one by one from Python (benchmarks/README.md, "The
# training loop"). The first iterations compile (a few minutes).
_base_ = './dino_dinovim-base-p16_4xb48-amp-100e_in1k.py'

custom_hooks = _base_.custom_hooks + [
    dict(type='CompileModulesHook', modules=['backbone', 'teacher.backbone'],
         mode='reduce-overhead', dynamic=False),
]
