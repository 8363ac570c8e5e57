# MLLA-T (MILA-T) on ImageNet-1k with the official recipe: 83.3 top-1 in the
# paper without MESA (Tab. 7). MESA, the official self-distillation from the EMA
# model (loss + 1.0 x CE(out, softmax(EMA out)) from 25 % of the epochs on), is
# not part of this recipe; with it the paper reports 83.5. See docs/mlla.md.
_base_ = ['./_base_/models/mlla-tiny.py', './_base_/mlla-recipe_32xb128-300e_in1k.py']
