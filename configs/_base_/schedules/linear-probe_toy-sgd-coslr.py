# The linear probe's schedule on toy data: SGD (momentum 0.9) without weight
# decay, cosine to 0 over the run (no `end`, no `T_max`: `train_cfg.max_epochs`
# alone sets the length), one validation at the end.
_base_ = './linear-probe_sgd-coslr-100e.py'

max_epochs = 10
optim_wrapper = dict(optimizer=dict(weight_decay=0.0))
param_scheduler = [dict(type='CosineAnnealingLR', by_epoch=True, begin=0)]
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
