"""ImageNet-Sketch / -A / -R datasets and the one wnid -> index mapping."""
import os
import os.path as osp
import re

import pytest
from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
from mmpretrain.registry import DATASETS

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.datasets.imagenet_wnids import IMAGENET_WNIDS, imagenet_class_index
from mmdinomamba.datasets.robustness import ImageNetA, ImageNetR, ImageNetSketch

from tests.helpers.robustness_data import README, make_wnid_folders


def test_wnid_table_is_the_sorted_imagenet_class_list():
    assert len(IMAGENET_WNIDS) == len(IMAGENET_CATEGORIES) == 1000
    assert len(set(IMAGENET_WNIDS)) == 1000
    # mmpretrain numbers the ImageNet class folders in sorted order
    assert list(IMAGENET_WNIDS) == sorted(IMAGENET_WNIDS)
    assert all(re.fullmatch(r'n\d{8}', w) for w in IMAGENET_WNIDS)


def test_class_index_is_the_position_in_the_table():
    wnids = [IMAGENET_WNIDS[i] for i in (999, 0, 417, 1)]
    assert imagenet_class_index(wnids) == {w: IMAGENET_WNIDS.index(w) for w in wnids}


@pytest.mark.parametrize('bad', ['n99999999', 'cat', 'N01440764'])
def test_class_index_rejects_ids_outside_imagenet(bad):
    with pytest.raises(ValueError, match=bad):
        imagenet_class_index([IMAGENET_WNIDS[3], bad])


# (class, folder below data_root, restricted to the classes present, extension)
LAYOUTS = {
    'ImageNetA': (ImageNetA, '', True, '.jpg'),
    'ImageNetR': (ImageNetR, '', True, '.jpg'),
    'ImageNetSketch': (ImageNetSketch, 'sketch', False, '.JPEG'),
}
COUNTS = {837: 3, 6: 2, 94: 1, 311: 4, 999: 2}  # 1000-way index -> images


@pytest.mark.parametrize('name', sorted(LAYOUTS))
def test_published_layout_gives_imagenet_labels(tmp_path, name):
    cls, prefix, restricted, ext = LAYOUTS[name]
    root = str(tmp_path / name)
    files = make_wnid_folders(osp.join(root, prefix), COUNTS, ext=ext,
                              readme=name != 'ImageNetSketch')
    dataset = DATASETS.build(dict(type=name, data_root=root))
    assert type(dataset) is cls
    expected = sorted((path, IMAGENET_WNIDS.index(wnid))
                      for wnid, paths in files.items() for path in paths)
    got = sorted((dataset.get_data_info(i)['img_path'], dataset.get_data_info(i)['gt_label'])
                 for i in range(len(dataset)))
    assert got == expected  # README.txt is not an image
    assert len(dataset.metainfo['classes']) == 1000
    if restricted:
        assert dataset.metainfo['imagenet_subset'] == sorted(COUNTS)
    else:
        assert 'imagenet_subset' not in dataset.metainfo


def test_nested_images_belong_to_their_class_folder(tmp_path):
    files = make_wnid_folders(str(tmp_path), {5: 1}, readme=False)
    wnid = IMAGENET_WNIDS[5]
    os.makedirs(tmp_path / wnid / 'more')
    os.rename(files[wnid][0], tmp_path / wnid / 'more' / 'x.png')
    dataset = ImageNetR(data_root=str(tmp_path), extensions=('.png', ))
    assert len(dataset) == 1 and dataset.get_data_info(0)['gt_label'] == 5


def test_missing_folder_is_named(tmp_path):
    missing = str(tmp_path / 'imagenet-a')
    with pytest.raises(FileNotFoundError, match='imagenet-a'):
        ImageNetA(data_root=missing)


def test_folder_without_class_folders(tmp_path):
    (tmp_path / README).write_text('x')
    with pytest.raises(FileNotFoundError, match='no class folders'):
        ImageNetR(data_root=str(tmp_path))


def test_class_folders_without_images(tmp_path):
    os.makedirs(tmp_path / IMAGENET_WNIDS[2])
    with pytest.raises(FileNotFoundError, match='no images'):
        ImageNetA(data_root=str(tmp_path))


@pytest.mark.parametrize('bad', ['n00000001', 'goldfish'])
def test_folder_not_named_by_an_imagenet_id(tmp_path, bad):
    make_wnid_folders(str(tmp_path), {1: 1})
    os.makedirs(tmp_path / bad)
    with pytest.raises(ValueError, match=f'not ImageNet-1k WordNet ids.*{bad}'):
        ImageNetSketch(data_root=str(tmp_path), data_prefix='')
