# The baseline + the block design "all" (Table 1): 28M parameters, 4.7G FLOPs and 79.4
# top-1 on ImageNet-1k in the paper. The model is ./_base_/models/linear-swin-t_+block-
# all.py; docs/mlla.md has our counts.
_base_ = [
    './_base_/models/linear-swin-t_+block-all.py',
    '../_base_/mlla-recipe_32xb128-300e_in1k.py',
]
