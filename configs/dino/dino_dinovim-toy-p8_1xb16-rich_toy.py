# DINO on the rich toy dataset (tools/run_demo.py generates it; by hand:
# python tools/make_toy_data.py data/toy_rich --style rich --num-classes 4
#   --train-per-class 32 --val-per-class 64 --size 64 --formats imagenet):
# the toy DinoVim recipe (dino_dinovim-toy-p8_1xb8-10e_toy.py) on shape-and-texture
# classes in random colours, cluttered backgrounds. The values below were picked
# by measurement on the 2-core CPU machine (docs/dino.md, "The demo").
_base_ = './dino_dinovim-toy-p8_1xb8-10e_toy.py'

data_root = 'data/toy_rich'
max_epochs = 10
train_dataloader = dict(batch_size=8, dataset=dict(data_root=data_root))
train_cfg = dict(max_epochs=max_epochs)
