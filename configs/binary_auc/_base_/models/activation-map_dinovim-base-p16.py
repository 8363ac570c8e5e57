# DinoVim-B as an ActivationMapModel: the prediction is the per-head cosine
# similarity between the [CLS] token and every patch token of the last block
# (24 heads of 32 channels), upsampled to the input size.
_base_ = '../../../_base_/models/dinovim-base-p16.py'

model = dict(
    type='ActivationMapModel',
    layer=-1,
    method='cosine',
    # every block through the final RMSNorm, so that other layers (layer=...)
    # compare like with like; the same as 'residual' for the last block
    feature_source='normed',
    data_preprocessor=dict(
        type='ImgDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True))
