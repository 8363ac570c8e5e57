# The linear probe of the comparison recipe at 256 tokens (tools/run_comparison.py
# --preset seq256): the 65-token recipe's probe (linear-probe_toy-rich-64px.py) on a
# backbone with 4 px patches, on the seq256 data root, 5 epochs of batches of 64
# (235 steps; the budget: docs/comparison.md, "At 256 tokens").
_base_ = ['./linear-probe_toy-rich-64px.py']

data_root = 'data/toy_rich_seq256'
patch_size = 4
batch_size = 64
max_epochs = 5

# what each probe adds to its DINO config's backbone: the 256-token patching too
probe_backbone = dict(patch_size=patch_size)
toy_dataset = dict(data_root=data_root, classes=f'{data_root}/classes.txt')
train_dataloader = dict(batch_size=batch_size, num_workers=4, dataset=toy_dataset)
val_dataloader = dict(batch_size=batch_size, num_workers=4, dataset=toy_dataset)
test_dataloader = val_dataloader
auto_scale_lr = dict(base_batch_size=batch_size)
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
default_hooks = dict(checkpoint=dict(interval=max_epochs))
