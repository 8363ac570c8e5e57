# The baseline + the input gate (Table 1): 29M parameters, 4.5G FLOPs and 77.8 top-1 on
# ImageNet-1k in the paper. The model is ./_base_/models/linear-swin-t_+input-gate.py;
# docs/mlla.md has our counts.
_base_ = [
    './_base_/models/linear-swin-t_+input-gate.py',
    '../_base_/mlla-recipe_32xb128-300e_in1k.py',
]
