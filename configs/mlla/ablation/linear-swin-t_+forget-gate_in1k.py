# The baseline + the forget gate (Tables 1 and 2): 29M parameters, 4.8G FLOPs and 78.4
# top-1 on ImageNet-1k in the paper. The model is ./_base_/models/linear-swin-t_+forget-
# gate.py; docs/mlla.md has our counts.
_base_ = [
    './_base_/models/linear-swin-t_+forget-gate.py',
    '../_base_/mlla-recipe_32xb128-300e_in1k.py',
]
