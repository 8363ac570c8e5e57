# The paper's ablation baseline (Han et al., NeurIPS 2024, Tables 1 and 2): Swin-T
# with global linear attention in place of its windowed softmax attention.
# Swin-T's layout: 4x4 patch embedding with LayerNorm, depths 2-2-6-2, widths
# 96-192-384-768, heads 3-6-12-24 (32 channels each), MLP ratio 4, Swin's patch
# merging, drop path 0.2, pre-norm Transformer blocks; the attention is
# Q = ELU(x W_q) + 1, K = ELU(x W_k) + 1, V = x W_v, Katharopoulos normalisation,
# over all tokens of the stage (no windows, no shift, no relative position bias),
# then the output projection. No position encoding. 28,265,032 parameters with
# the 1000-class head (the paper: 28M; Swin-T's relative position tables, 23k,
# are gone).
#
# Where the paper is silent we chose: the attention's eps (1e-6, MLLA's), the
# patch embedding and merging pad odd sizes (any input size runs), and the
# classifier, augmentation and schedule of configs/mlla (MLLA's official recipe,
# without MESA): the paper gives no separate recipe for its ablations.
_base_ = '../../../_base_/models/mlla-tiny.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='MLLA',
        arch=dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                  mlp_ratio=4.0),
        img_size=224,
        stem='patch',
        downsample='merging',
        block_design='transformer',
        cpe=False,
        mixer_cfg=dict(rope=False, lepe=False, value_proj=True),
        drop_path_rate=0.2,
        out_indices=(3, )),
    head=dict(in_channels=768))
