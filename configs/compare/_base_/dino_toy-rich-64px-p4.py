# The comparison recipe at 256 tokens (tools/run_comparison.py --preset seq256):
# the 65-token recipe's DINO (dino_toy-rich-64px.py: same data style, crops, head,
# schedule shape) with 4 px patches on the same 64 px images, so each global crop
# is 16 x 16 = 256 patch tokens (local crops, 32 px: 64), four times the head width
# of 64 (ViT, DinoVim) and eight times MLLA's 32: a head's token-mixing matrix of
# rank <= 64 (linear attention) can no longer be full rank, a softmax or SSD one can.
# Only the token count changes against the 65-token recipe (same 64 px images, same
# host-side augmentation per image), so the two reports differ by the length alone.
# The run is sized for one H100/H200 in 14 minutes (docs/comparison.md, "At 256
# tokens"): 250 training images per class, 6 epochs of batches of 64 (282 steps).
_base_ = ['./dino_toy-rich-64px.py']

data_root = 'data/toy_rich_seq256'
patch_size = 4
batch_size = 64
max_epochs = 6
warmup_epochs = 1
knn_interval = 3

# four runs side by side on 16 host cores: 4 workers each
train_dataloader = dict(batch_size=batch_size, num_workers=4,
                        dataset=dict(data_root=data_root))
optim_wrapper = dict(optimizer=dict(lr=5e-4 * batch_size / 256))
auto_scale_lr = dict(base_batch_size=batch_size)
param_scheduler = [
    dict(s, end=warmup_epochs) if s.type == 'LinearLR' else
    dict(s, begin=warmup_epochs) if s.type == 'CosineAnnealingLR' else s
    for s in _base_.param_scheduler
]
train_cfg = dict(max_epochs=max_epochs)
# the k-NN monitor on this data root, at iteration 0 and every 3 epochs
knn_bank = dict(dataset=dict(data_root=data_root))
knn_query = dict(dataset=dict(data_root=data_root))
custom_hooks = [
    dict(h, interval=knn_interval,
         bank_dataloader=dict(h.bank_dataloader,
                              dataset=dict(h.bank_dataloader.dataset,
                                           data_root=data_root)),
         query_dataloader=dict(h.query_dataloader,
                               dataset=dict(h.query_dataloader.dataset,
                                            data_root=data_root)))
    if h.type == 'KNNMonitorHook' else h for h in _base_.custom_hooks
]
default_hooks = dict(checkpoint=dict(interval=max_epochs))
