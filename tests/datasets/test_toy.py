"""The toy dataset generator: layout, determinism, masks against pixels, COCO."""
import json
import os
import os.path as osp

import numpy as np
import pytest
from matplotlib.path import Path
from PIL import Image

from mmdinomamba.datasets import (SHAPES, make_toy_dataset, mask_to_rle,
                                  render_toy_sample, toy_class_names)

NUM_CLASSES = 4
ARGS = dict(num_classes=NUM_CLASSES, train_per_class=2, val_per_class=1, size=48,
            seed=3)
# The generator keeps backgrounds at HSV saturation <= 0.2 and objects >= 0.65,
# so a mask can be read back from the pixels (uint8 rounding moves it < 0.03).
SATURATION_SPLIT = 0.45


@pytest.fixture(scope='module')
def toy_root(toy_data):
    return toy_data(**ARGS)


def read(path, dtype=np.int64):
    return np.array(Image.open(path), dtype)


def all_files(root):
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = osp.join(folder, name)
            with open(path, 'rb') as file:
                files[osp.relpath(path, root)] = file.read()
    return files


def hsv(image):
    """(height, width, 3) uint8 RGB -> hue, saturation in [0, 1], (height, width)."""
    rgb = image.astype(np.float64) / 255
    high, low = rgb.max(-1), rgb.min(-1)
    sat = np.where(high > 0, (high - low) / np.maximum(high, 1e-12), 0)
    hue = np.array(Image.fromarray(image).convert('HSV'))[..., 0] / 255.0
    return hue, sat


def rle_decode(rle):
    flat = np.zeros(int(np.prod(rle['size'])), bool)
    start = 0
    for i, run in enumerate(rle['counts']):
        if i % 2:
            flat[start:start + run] = True
        start += run
    assert start == flat.size
    return flat.reshape(rle['size'], order='F')


def test_layout(toy_root):
    names = toy_class_names(NUM_CLASSES)
    assert names == sorted(names)
    assert [n.split('_')[1] for n in names] == \
        [SHAPES[k % 3] for k in range(NUM_CLASSES)]
    with open(osp.join(toy_root, 'classes.txt')) as file:
        assert file.read().split() == names
    for split, ade_split, per_class in (('train', 'training', 2),
                                        ('val', 'validation', 1)):
        with open(osp.join(toy_root, 'meta', f'{split}.txt')) as file:
            lines = [line.split() for line in file]
        assert len(lines) == NUM_CLASSES * per_class
        for path, label in lines:
            assert path.split('/')[0] == names[int(label)]
            assert osp.isfile(osp.join(toy_root, split, path))
            assert osp.isfile(osp.join(toy_root, 'masks', split, path))
            stem = osp.splitext(osp.basename(path))[0]
            for sub in ('images', 'annotations'):
                ext = 'jpg' if sub == 'images' else 'png'
                assert osp.isfile(
                    osp.join(toy_root, 'ade', sub, ade_split, f'{stem}.{ext}'))
            assert osp.isfile(osp.join(toy_root, 'coco', split, f'{stem}.jpg'))
        ade_images = os.listdir(osp.join(toy_root, 'ade', 'images', ade_split))
        assert len(ade_images) == len(lines)
    leftovers = [n for n in os.listdir(osp.dirname(toy_root)) if n.startswith('.')]
    assert leftovers == []


def test_masks_agree_with_pixels(toy_root):
    with open(osp.join(toy_root, 'meta', 'train.txt')) as file:
        lines = [line.split() for line in file]
    for path, image_label in lines:
        image = read(osp.join(toy_root, 'train', path), np.uint8)
        rgb_ids = read(osp.join(toy_root, 'masks', 'train', path))
        assert (rgb_ids[..., 2] == 0).all()
        ids = rgb_ids[..., 0] + 256 * rgb_ids[..., 1]
        stem = osp.splitext(osp.basename(path))[0]
        ade = read(osp.join(toy_root, 'ade', 'annotations', 'training', f'{stem}.png'))
        assert ade.ndim == 2 and (ade == ids).all()
        hue, sat = hsv(image)
        # mask pixels exist exactly where the saturated objects are
        assert ((sat > SATURATION_SPLIT) == (ids > 0)).all()
        labels, areas = np.unique(ids[ids > 0], return_counts=True)
        # the image's class is its dominant (largest) labelled region
        assert labels[np.argmax(areas)] == int(image_label) + 1
        for label in labels:
            # every object's hue is its class hue (HSV hue in 1/255 steps)
            dist = np.abs(hue[ids == label] - (label - 1) / NUM_CLASSES)
            dist = np.minimum(dist, 1 - dist)
            assert np.median(dist) < 0.3 / NUM_CLASSES


def test_coco_annotations(toy_root):
    for split, ade_split in (('train', 'training'), ('val', 'validation')):
        ann_file = osp.join(toy_root, 'coco', 'annotations', f'instances_{split}.json')
        with open(ann_file) as file:
            coco = json.load(file)
        assert [c['id'] for c in coco['categories']] == list(range(1, NUM_CLASSES + 1))
        assert [c['name'] for c in coco['categories']] == toy_class_names(NUM_CLASSES)
        assert len({img['id'] for img in coco['images']}) == len(coco['images'])
        ann_ids = [ann['id'] for ann in coco['annotations']]
        assert len(set(ann_ids)) == len(ann_ids)
        kinds = set()
        for img in coco['images']:
            stem = osp.splitext(img['file_name'])[0]
            ids = read(osp.join(toy_root, 'ade', 'annotations', ade_split,
                                f'{stem}.png'))
            assert (img['height'], img['width']) == ids.shape
            anns = [a for a in coco['annotations'] if a['image_id'] == img['id']]
            assert 1 <= len(anns) <= 3
            assert sum(a['area'] for a in anns) == (ids > 0).sum()
            for ann in anns:
                x, y, w, h = ann['bbox']
                box = ids[int(y):int(y + h), int(x):int(x + w)]
                # the instance's class fills its box partly and touches each side
                inside = box == ann['category_id']
                assert inside.any(0)[[0, -1]].all() and inside.any(1)[[0, -1]].all()
                seg = ann['segmentation']
                if isinstance(seg, dict):
                    kinds.add('rle')
                    assert ann['category_id'] % 3 == 1  # ellipses (class % 3 == 0)
                    mask = rle_decode(seg)
                    assert mask.sum() == ann['area']
                    assert (ids[mask] == ann['category_id']).all()
                else:
                    kinds.add('polygon')
                    assert len(seg) == 1 and len(seg[0]) in (6, 8)
                    # the instance = the pixels whose centres the polygon holds
                    rows, cols = np.mgrid[0:ids.shape[0], 0:ids.shape[1]] + 0.5
                    inside = Path(np.reshape(seg[0], (-1, 2))).contains_points(
                        np.stack([cols.ravel(), rows.ravel()], -1)).reshape(ids.shape)
                    # (a centre exactly on an edge may go either way)
                    assert (inside & (ids != ann['category_id'])).sum() <= 2
                    assert abs(inside.sum() - ann['area']) <= 2
        assert kinds == {'rle', 'polygon'}


def test_coco_loads_with_pycocotools(toy_root):
    coco_module = pytest.importorskip('pycocotools.coco')
    coco = coco_module.COCO(
        osp.join(toy_root, 'coco', 'annotations', 'instances_train.json'))
    for ann in coco.loadAnns(coco.getAnnIds()):
        img = coco.loadImgs(ann['image_id'])[0]
        stem = osp.splitext(img['file_name'])[0]
        ids = read(osp.join(toy_root, 'ade', 'annotations', 'training', f'{stem}.png'))
        ours = ids == ann['category_id']  # may hold two objects of this class
        theirs = coco.annToMask(ann).astype(bool)
        if isinstance(ann['segmentation'], dict):
            assert (theirs <= ours).all() and theirs.sum() == ann['area']
        else:
            # pycocotools rasterises polygon edges its own way: a few boundary
            # pixels differ (objects here are >= ~20 pixels)
            assert (theirs & ~ours).sum() <= 0.25 * ann['area']
            assert abs(int(theirs.sum()) - ann['area']) <= 0.25 * ann['area']


def test_rle_round_trip():
    rng = np.random.default_rng(0)
    for mask in (rng.random((5, 7)) < 0.5, np.ones((3, 4), bool),
                 np.zeros((2, 2), bool)):
        rle = mask_to_rle(mask)
        assert sum(rle['counts']) == mask.size and (rle_decode(rle) == mask).all()


def test_deterministic(tmp_path, toy_root):
    again = make_toy_dataset(str(tmp_path / 'again'), **ARGS)
    assert all_files(again) == all_files(toy_root)
    image, label_map, objects = render_toy_sample(np.random.default_rng(5), 1, 3, 40)
    image2, label_map2, _ = render_toy_sample(np.random.default_rng(5), 1, 3, 40)
    assert (image == image2).all() and (label_map == label_map2).all()
    assert image.shape == (40, 40, 3) and image.dtype == np.uint8
    assert objects[0].label == 1 and objects[0].shape == 'rectangle'
    other = make_toy_dataset(str(tmp_path / 'other'), **dict(ARGS, seed=4))
    assert all_files(other)['train/c000_ellipse/c000_ellipse_00000.png'] != \
        all_files(toy_root)['train/c000_ellipse/c000_ellipse_00000.png']


def test_idempotent_and_guarded(tmp_path):
    root = str(tmp_path / 'data')
    kwargs = dict(ARGS, formats=['imagenet'])
    make_toy_dataset(root, **kwargs)
    stamp = osp.join(root, 'toy_data.json')
    before = os.stat(stamp).st_mtime_ns, os.stat(root).st_ino
    assert make_toy_dataset(root, **kwargs) == root
    assert (os.stat(stamp).st_mtime_ns, os.stat(root).st_ino) == before
    assert not osp.exists(osp.join(root, 'coco'))
    with pytest.raises(ValueError, match=r"differ: \['size'\]"):
        make_toy_dataset(root, **dict(kwargs, size=32))
    make_toy_dataset(root, **dict(kwargs, size=32), overwrite=True)
    image = read(osp.join(root, 'train/c000_ellipse/c000_ellipse_00000.png'))
    assert image.shape == (32, 32, 3)
    with open(stamp, 'w') as file:
        file.write('{broken')
    with pytest.raises(ValueError, match='unreadable'):
        make_toy_dataset(root, **kwargs)
    make_toy_dataset(root, **kwargs, overwrite=True)
    foreign = tmp_path / 'foreign'
    foreign.mkdir()
    (foreign / 'keep.txt').write_text('mine')
    with pytest.raises(FileExistsError, match='without'):
        make_toy_dataset(str(foreign), **kwargs, overwrite=True)
    assert (foreign / 'keep.txt').read_text() == 'mine'
    empty = tmp_path / 'empty'
    empty.mkdir()
    make_toy_dataset(str(empty), **kwargs)
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith('.')) == []


@pytest.mark.parametrize('bad, message', [
    (dict(num_classes=1), 'num_classes'),
    (dict(num_classes=255), 'num_classes'),
    (dict(num_classes=2.0), 'num_classes'),
    (dict(train_per_class=0), 'train_per_class'),
    (dict(val_per_class=-1), 'val_per_class'),
    (dict(size=16), 'size'),
    (dict(seed=-1), 'seed'),
    (dict(seed=True), 'seed'),
    (dict(formats=['imagenet', 'voc']), 'formats'),
    (dict(formats=[]), 'formats'),
])
def test_bad_arguments(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        make_toy_dataset(str(tmp_path / 'data'), **dict(ARGS, **bad))
    assert os.listdir(tmp_path) == []


def test_cli(tmp_path, capsys, load_tool):
    make_toy_data = load_tool('tools/make_toy_data.py')
    root = str(tmp_path / 'cli')
    make_toy_data.main([root, '--num-classes', '2', '--train-per-class', '1',
                        '--val-per-class', '1', '--size', '32', '--formats', 'ade'])
    assert sorted(os.listdir(root)) == ['ade', 'classes.txt', 'toy_data.json']
    with pytest.raises(SystemExit) as exit_info:
        make_toy_data.main([str(tmp_path / 'bad'), '--num-classes', '1'])
    assert exit_info.value.code == 2
    assert 'num_classes must be an int' in capsys.readouterr().err


def test_loads_with_mmpretrain(toy_root):
    datasets = pytest.importorskip('mmpretrain.datasets')
    dataset = datasets.CustomDataset(
        data_root=toy_root, ann_file='meta/val.txt', data_prefix='val',
        classes=osp.join(toy_root, 'classes.txt'))
    assert len(dataset) == NUM_CLASSES
    assert dataset.CLASSES == tuple(toy_class_names(NUM_CLASSES))
    info = dataset.get_data_info(1)
    assert info['gt_label'] == 1 and osp.isfile(info['img_path'])


def test_loads_with_mmseg(toy_root):
    datasets = pytest.importorskip('mmseg.datasets')
    # ADE20KDataset fixes its 150 class names; the toy labels go through the
    # generic dataset with ADE20K's conventions (.jpg images, reduce_zero_label).
    dataset = datasets.BaseSegDataset(
        data_root=osp.join(toy_root, 'ade'),
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True,
        metainfo=dict(classes=tuple(toy_class_names(NUM_CLASSES))))
    assert len(dataset) == NUM_CLASSES
    info = dataset.get_data_info(0)
    assert osp.isfile(info['img_path']) and osp.isfile(info['seg_map_path'])


def test_loads_with_mmdet(toy_root):
    datasets = pytest.importorskip('mmdet.datasets')
    pytest.importorskip('pycocotools')
    dataset = datasets.CocoDataset(
        data_root=osp.join(toy_root, 'coco'),
        ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
        metainfo=dict(classes=tuple(toy_class_names(NUM_CLASSES))))
    assert len(dataset) == 2 * NUM_CLASSES
    for index in range(len(dataset)):
        instances = dataset.get_data_info(index)['instances']
        assert 1 <= len(instances) <= 3
        assert all(0 <= inst['bbox_label'] < NUM_CLASSES for inst in instances)


def test_rich_style(tmp_path):
    from mmdinomamba.datasets import RICH_SHAPES, RICH_TEXTURES, render_rich_sample
    names = toy_class_names(12, 'rich')
    # classes 0..11 are the 12 distinct (shape, texture) pairs
    pairs = [tuple(n.split('_', 1)[1].split('-')) for n in names]
    assert len(set(pairs)) == 12 and {s for s, _ in pairs} == set(RICH_SHAPES) and \
        {t for _, t in pairs} == set(RICH_TEXTURES)
    hues = {}
    for label in range(4):
        for i in range(12):
            image, label_map, objects = render_rich_sample(
                np.random.default_rng([1, label, i]), label, 4, 64)
            assert objects[0].label == label
            assert objects[0].shape == pairs[label][0]
            ids, areas = np.unique(label_map[label_map > 0], return_counts=True)
            assert ids[np.argmax(areas)] == label + 1
            for obj in objects:
                assert (label_map[obj.mask] == obj.label + 1).all()
            hue, _ = hsv(image)
            hues.setdefault(label, []).append(np.median(hue[objects[0].mask]))
    # colour carries no class: every class's main objects span most of the hue circle
    for values in hues.values():
        assert np.ptp(values) > 0.5
    root = make_toy_dataset(str(tmp_path / 'rich'), **dict(ARGS, style='rich'))
    with open(osp.join(root, 'classes.txt')) as file:
        assert file.read().split() == toy_class_names(NUM_CLASSES, 'rich')
    with open(osp.join(root, 'toy_data.json')) as file:
        assert json.load(file)['style'] == 'rich'
    with open(osp.join(root, 'coco', 'annotations', 'instances_train.json')) as file:
        coco = json.load(file)
    for ann in coco['annotations']:  # crosses are not convex: RLE
        category = coco['categories'][ann['category_id'] - 1]
        if category['supercategory'] == 'cross':
            assert isinstance(ann['segmentation'], dict)
    with pytest.raises(ValueError, match="differ: \\['style'\\]"):
        make_toy_dataset(root, **ARGS)
    with pytest.raises(ValueError, match='unknown style'):
        make_toy_dataset(str(tmp_path / 'x'), **dict(ARGS, style='fancy'))


def _central_share(placement, n=200, size=64):
    from mmdinomamba.datasets import render_rich_sample
    inside = total = 0
    for i in range(n):
        _, label_map, objects = render_rich_sample(
            np.random.default_rng([0, 1, i]), i % 12, 12, size, placement=placement)
        assert objects and objects[0].mask.any()
        fg = label_map > 0
        total += fg.sum()
        inside += fg[size // 4:3 * size // 4, size // 4:3 * size // 4].sum()
    return inside / total


def test_uniform_placement_has_no_centre_bias(tmp_path):
    """'centred' crowds object pixels into the central quarter of the image (a
    fixed centred map scores well on it); 'uniform' puts about the quarter's
    share of the area there. 'centred' stays the default, draw for draw (its
    stamps carry no placement)."""
    from mmdinomamba.datasets import render_rich_sample
    assert _central_share('centred') > 0.6
    assert 0.2 < _central_share('uniform') < 0.3
    a = render_rich_sample(np.random.default_rng(5), 3, 12, 64)
    b = render_rich_sample(np.random.default_rng(5), 3, 12, 64, placement='centred')
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    rich = dict(ARGS, style='rich')
    root = make_toy_dataset(str(tmp_path / 'centred'), **rich)
    with open(osp.join(root, 'toy_data.json')) as file:
        assert 'placement' not in json.load(file)
    root = make_toy_dataset(str(tmp_path / 'uniform'), **rich, placement='uniform')
    with open(osp.join(root, 'toy_data.json')) as file:
        assert json.load(file)['placement'] == 'uniform'
    with pytest.raises(ValueError, match="differ: \\['placement'\\]"):
        make_toy_dataset(root, **rich)
    with pytest.raises(ValueError, match="unknown placement 'middle'"):
        make_toy_dataset(str(tmp_path / 'x'), **rich, placement='middle')
    with pytest.raises(ValueError, match="needs style='rich'"):
        make_toy_dataset(str(tmp_path / 'y'), **ARGS, placement='uniform')
