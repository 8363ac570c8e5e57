# The baseline + the block design "sub" (Table 1): 31M parameters, 4.8G FLOPs and 80.9
# top-1 on ImageNet-1k in the paper. The model is ./_base_/models/linear-swin-t_+block-
# sub.py; docs/mlla.md has our counts.
_base_ = [
    './_base_/models/linear-swin-t_+block-sub.py',
    '../_base_/mlla-recipe_32xb128-300e_in1k.py',
]
