# ImageNet-A (Hendrycks et al., CVPR 2021): natural adversarial photos of 200
# ImageNet classes, scored with the 1000-way logits restricted to those classes.
# Layout: data/imagenet-a/<wnid>/*.jpg (imagenet-a.tar unpacked into data/).
robustness_dataset = dict(type='ImageNetA', data_root='data/imagenet-a')
robustness_evaluator = dict(type='SubsetAccuracy')
