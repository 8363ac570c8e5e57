# The model of ./mask-rcnn_mlla-tiny_fpn.py with drop path 0.3, for the 3x schedule:
# the official 3x settings of MLLA-T and MLLA-S use 0.3 (github LeapLabTHU/MLLA,
# downstream/detection/configs/mlla/mlla_{t,s}_mrcnn_3x.py; MLLA-B has none).
_base_ = './mask-rcnn_mlla-tiny_fpn.py'

model = dict(backbone=dict(drop_path_rate=0.3))
