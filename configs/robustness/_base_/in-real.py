# ReaL (Beyer et al., 2020): the ImageNet val set scored against the Reassessed
# Labels, data/imagenet/real.json (one list of labels per val image; images with
# an empty list are excluded and counted).
robustness_dataset = dict(type='ImageNet', data_root='data/imagenet', split='val')
robustness_evaluator = dict(type='ReaLAccuracy',
                            real_file='data/imagenet/real.json')
