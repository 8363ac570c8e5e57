# ImageNet-R (Hendrycks et al., ICCV 2021): renditions of 200 ImageNet classes,
# scored with the 1000-way logits restricted to those classes.
# Layout: data/imagenet-r/<wnid>/*.jpg (imagenet-r.tar unpacked into data/).
robustness_dataset = dict(type='ImageNetR', data_root='data/imagenet-r')
robustness_evaluator = dict(type='SubsetAccuracy')
