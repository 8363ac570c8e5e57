# DINO with a DinoVim-B student (24 bidirectional Mamba-2 blocks, 768 wide) and its
# EMA teacher. A config for another backbone swaps `model.backbone` and sets the
# head's `in_channels` to the backbone width.
_base_ = './dinovim-base-p16.py'

out_channels = 65536  # K, the number of prototypes
model = dict(
    type='DINO',
    backbone=dict(
        out_type='cls_token',  # the final-normed middle [CLS] token
        drop_path_rate=0.1),
    head=dict(
        type='DINOHead',
        in_channels=768,
        out_channels=out_channels,
        hidden_channels=2048,
        bottleneck_channels=256,
        num_layers=3,
        use_bn=False,
        norm_last_layer=True),
    loss=dict(
        type='DINOLoss',
        out_channels=out_channels,
        student_temp=0.1,
        teacher_temp=0.04,  # then set each epoch by DINOTeacherTempHook
        center_momentum=0.9),
    num_global_views=2,
    teacher_momentum=0.996)  # then set each iteration by DINOTeacherMomentumHook
