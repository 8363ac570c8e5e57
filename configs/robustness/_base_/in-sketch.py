# ImageNet-Sketch (Wang et al., NeurIPS 2019): sketches of the 1000 ImageNet
# classes, scored 1000-way. Layout: data/imagenet-sketch/sketch/<wnid>/*.JPEG
# (ImageNet-Sketch.zip unpacked into data/imagenet-sketch). A leaf config splices
# these two fragments into the test dataloader (keeping its probe's test
# pipeline) and the test evaluator.
robustness_dataset = dict(type='ImageNetSketch', data_root='data/imagenet-sketch',
                          data_prefix='sketch')
robustness_evaluator = dict(type='Accuracy', topk=(1, ))
