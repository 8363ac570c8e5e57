# DINO's linear-probe schedule: SGD (momentum 0.9), lr 0.001 * batch / 256,
# cosine to 0 over 100 epochs (per epoch). Weight decay is set per backbone
# (official Dino-Mamba: 0 for T, 1e-3 for S, 1e-2 for B).
_base_ = 'mmpretrain::_base_/schedules/imagenet_sgd_coslr_100e.py'

optim_wrapper = dict(
    optimizer=dict(lr=0.001 * (128 * 4) / 256, momentum=0.9, weight_decay=0.0))
# the lr above is for 128 images/GPU x 4 GPUs
auto_scale_lr = dict(base_batch_size=128 * 4, enable=False)
