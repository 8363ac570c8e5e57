# The baseline - the multi-head design (Table 1): 24M parameters, 3.9G FLOPs and 73.5
# top-1 on ImageNet-1k in the paper. The model is
# ./_base_/models/linear-swin-t_-multi-head.py; docs/mlla.md has our counts.
_base_ = [
    './_base_/models/linear-swin-t_-multi-head.py',
    '../_base_/mlla-recipe_32xb128-300e_in1k.py',
]
