"""ImageNetS dataset and LoadRGBLabelMap, on the toy data and an ImageNet-S layout."""
import os

import numpy as np
import pytest
from mmpretrain.registry import DATASETS, TRANSFORMS
from PIL import Image

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.datasets import encode_rgb_label_map, render_toy_sample
from mmdinomamba.datasets.imagenet_s import ImageNetS
from mmdinomamba.datasets.transforms import LoadRGBLabelMap

TOY = dict(num_classes=3, train_per_class=1, val_per_class=2, size=40, seed=3)
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(32, 32)),
    dict(type='LoadRGBLabelMap'),
    dict(type='PackInputs', algorithm_keys=['gt_seg_map']),
]


@pytest.fixture(scope='module')
def toy_root(toy_data):
    return toy_data(formats=['imagenet'], **TOY)


def toy_dataset(root, **kwargs):
    return DATASETS.build(dict(
        type='ImageNetS', data_root=root,
        data_prefix=dict(img_path='val', seg_map_path='masks/val'),
        ann_file='meta/val.txt', classes=os.path.join(root, 'classes.txt'),
        pipeline=PIPELINE, **kwargs))


def test_registered():
    assert DATASETS.get('ImageNetS') is ImageNetS
    assert TRANSFORMS.get('LoadRGBLabelMap') is LoadRGBLabelMap


def test_toy_label_maps_reach_the_sample(toy_root):
    dataset = toy_dataset(toy_root)
    assert len(dataset) == TOY['num_classes'] * TOY['val_per_class']
    for index in range(len(dataset)):
        info = dataset.get_data_info(index)
        label, i = info['gt_label'], index % TOY['val_per_class']
        # the generator's own label map of this sample (val = split 1), drawn again
        rng = np.random.default_rng([TOY['seed'], 1, label * TOY['val_per_class'] + i])
        _, expected, _ = render_toy_sample(rng, label, TOY['num_classes'], TOY['size'])
        sample = dataset[index]
        assert tuple(sample['inputs'].shape) == (3, 32, 32)
        # loaded after the resize: the label map keeps its own resolution
        gt = sample['data_samples'].gt_seg_map
        assert gt.shape == (TOY['size'], TOY['size'])
        assert (gt == expected).all()
        assert info['seg_map_path'].endswith(
            os.path.relpath(info['img_path'], os.path.join(toy_root, 'val')))


def test_imagenet_s_layout(tmp_path):
    """The default prefixes: validation/<wnid>/*.JPEG and validation-segmentation."""
    ids = np.array([[0, 1000], [919, 5]])  # ids above 255 use the G channel
    for wnid in ('n01443537', 'n01491361'):
        for folder in ('validation', 'validation-segmentation'):
            os.makedirs(tmp_path / folder / wnid)
        Image.new('RGB', (2, 2)).save(tmp_path / 'validation' / wnid / 'a.JPEG')
        Image.fromarray(encode_rgb_label_map(ids)).save(
            tmp_path / 'validation-segmentation' / wnid / 'a.png')
    dataset = DATASETS.build(dict(type='ImageNetS', data_root=str(tmp_path),
                                  pipeline=[dict(type='LoadRGBLabelMap')]))
    assert dataset.metainfo['classes'] == ('n01443537', 'n01491361')
    assert [dataset[i]['gt_seg_map'].tolist() for i in range(2)] == [ids.tolist()] * 2
    os.remove(tmp_path / 'validation-segmentation' / 'n01491361' / 'a.png')
    with pytest.raises(FileNotFoundError, match='1 of 2 label maps are missing'):
        DATASETS.build(dict(type='ImageNetS', data_root=str(tmp_path)))


def test_errors(toy_root, tmp_path):
    with pytest.raises(ValueError, match='seg_map_path'):
        ImageNetS(data_root=toy_root, data_prefix=dict(img_path='val'))
    with pytest.raises(FileNotFoundError, match='label map folder not found'):
        ImageNetS(data_root=toy_root, ann_file='meta/val.txt',
                  data_prefix=dict(img_path='val', seg_map_path='nowhere'))
    with pytest.raises(ValueError, match='no seg_map_path'):
        LoadRGBLabelMap()(dict(img_path='x.png'))
    with pytest.raises(FileNotFoundError, match='missing.png'):
        LoadRGBLabelMap()(dict(seg_map_path=str(tmp_path / 'missing.png')))
