"""ImageFolder: plain folders, class folders, image lists, empty inputs, bad images."""
import logging
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import MMLogger
from PIL import Image

import mmdinomamba.registry  # noqa: F401
from mmdinomamba.datasets.image_folder import ImageFolder

LOAD = [dict(type='LoadImageFromFile')]


def write_image(path, seed=0, size=12, fmt=None):
    os.makedirs(osp.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)


def write_truncated_png(path):
    write_image(path, seed=5, size=64)
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])


def build(**kwargs):
    from mmpretrain.registry import DATASETS
    return DATASETS.build(dict(type='ImageFolder', pipeline=LOAD, **kwargs))


def test_plain_folder_nested_and_mixed_case_extensions(tmp_path):
    write_image(str(tmp_path / 'b.png'))
    write_image(str(tmp_path / 'a.JPG'), fmt='JPEG')
    write_image(str(tmp_path / 'deeper/more/c.jpeg'), fmt='JPEG')
    (tmp_path / 'notes.txt').write_text('not an image')
    ds = build(data_root=str(tmp_path))
    found = [osp.relpath(ds.get_data_info(i)['img_path'], tmp_path)
             for i in range(len(ds))]
    assert found == ['a.JPG', 'b.png', 'deeper/more/c.jpeg']  # sorted, recursive
    assert ds[2]['img'].shape == (12, 12, 3)
    assert 'gt_label' not in ds.get_data_info(0)


def test_class_folders_without_a_list(tmp_path):
    """The tree that failed as mmpretrain's ImageNet (not its 1000 classes)."""
    for cls in ('cat', 'dog', 'zebra'):
        for i in range(2):
            write_image(str(tmp_path / 'train' / cls / f'{i}.png'), seed=i)
    ds = build(data_root=str(tmp_path), split='train')
    assert len(ds) == 6
    assert ds.get_data_info(5)['img_path'] == str(tmp_path / 'train/zebra/1.png')


def test_imagenet_layout_reads_meta_list_with_labels(tmp_path):
    for name in ('x/1.png', 'y/2.png', 'y/3.png'):
        write_image(str(tmp_path / 'train' / name))
    os.makedirs(tmp_path / 'meta')
    (tmp_path / 'meta/train.txt').write_text('y/3.png 1\nx/1.png 0\n\n')
    ds = build(data_root=str(tmp_path), split='train')
    assert [ds.get_data_info(i)['img_path'] for i in range(len(ds))] == \
        [str(tmp_path / 'train/y/3.png'), str(tmp_path / 'train/x/1.png')]
    assert [ds.get_data_info(i)['gt_label'] for i in range(len(ds))] == [1, 0]


def test_empty_list_names_the_file(tmp_path):
    write_image(str(tmp_path / 'train/x/1.png'))
    os.makedirs(tmp_path / 'meta')
    (tmp_path / 'meta/train.txt').write_text('\n')
    with pytest.raises(ValueError, match=rf'image list {tmp_path}/meta/train.txt is '
                       'empty'):
        build(data_root=str(tmp_path), split='train')


def test_empty_or_missing_folder_and_missing_list(tmp_path):
    (tmp_path / 'empty/sub').mkdir(parents=True)
    (tmp_path / 'empty/sub/readme.md').write_text('no images here')
    with pytest.raises(ValueError, match=rf'found no images under {tmp_path}/empty'):
        build(data_root=str(tmp_path / 'empty'))
    with pytest.raises(FileNotFoundError, match=rf'image folder {tmp_path}/nope'):
        build(data_root=str(tmp_path), split='nope')
    with pytest.raises(FileNotFoundError, match=r'image list .*list.txt does not exist'):
        build(data_root=str(tmp_path), ann_file='list.txt')


@pytest.fixture
def folder_with_bad_images(tmp_path):
    for i in range(3):
        write_image(str(tmp_path / f'good{i}.png'), seed=i)
    (tmp_path / 'garbage.jpg').write_bytes(b'this is not a JPEG at all' * 10)
    write_truncated_png(str(tmp_path / 'truncated.png'))
    return tmp_path


@pytest.mark.parametrize('name', ['garbage.jpg', 'truncated.png'])
def test_strict_default_names_the_unreadable_image(folder_with_bad_images, name):
    ds = build(data_root=str(folder_with_bad_images))
    names = [osp.basename(ds.get_data_info(i)['img_path']) for i in range(len(ds))]
    with pytest.raises(ValueError,
                       match=rf'cannot read image .*{name} .*skip_unreadable'):
        ds[names.index(name)]


class Collect(logging.Handler):
    """Keeps the messages mmengine's logger emits (it does not propagate)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_skip_unreadable_warns_once_per_file_and_counts(folder_with_bad_images,
                                                        monkeypatch):
    ds = build(data_root=str(folder_with_bad_images), skip_unreadable=True)
    collect = Collect()
    logger = MMLogger.get_current_instance()
    monkeypatch.setattr(logger, 'handlers', logger.handlers + [collect])
    # the random refetch may land on a bad image again: skipped, not re-warned
    samples = [ds[i] for i in range(len(ds)) for _ in range(3)]
    assert all(osp.basename(s['img_path']).startswith('good') for s in samples)
    assert sorted(osp.basename(p) for p in ds.skipped) == ['garbage.jpg', 'truncated.png']
    assert len(collect.messages) == 2
    for path, message, count in zip(ds.skipped, collect.messages, (1, 2)):
        assert f'skipping unreadable image {path}' in message
        assert f'{count} skipped in this process' in message
    ds.log_skipped()  # what runs at process exit, run now (and then not again)
    assert collect.messages[-1].startswith('ImageFolder: skipped 2 unreadable image(s)')
    assert all(path in collect.messages[-1] for path in ds.skipped)


@pytest.mark.slow
def test_skip_count_is_logged_when_a_data_worker_ends(folder_with_bad_images, capfd):
    """A data worker logs its count when it exits (the end of the epoch here)."""
    ds = build(data_root=str(folder_with_bad_images), skip_unreadable=True)
    # a logger of its own, the current one (whatever ran before): the worker
    # inherits it, and its console handler writes to the stdout capfd reads
    MMLogger.get_instance('test-skip-count-worker-exit')
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=1,
                                         collate_fn=pseudo_collate)
    batches = list(loader)  # one epoch; the worker shuts down at its end
    assert [len(b['img']) for b in batches] == [5]
    assert ds.skipped == []  # the main process read nothing itself
    out = capfd.readouterr()
    summary = [line for line in (out.out + out.err).splitlines()
               if 'skipped 2 unreadable image(s)' in line]
    assert len(summary) == 1, out.out[-3000:] + out.err[-3000:]
    assert 'garbage.jpg' in summary[0] and 'truncated.png' in summary[0]


def test_pipeline_errors_are_not_taken_for_bad_images(tmp_path):
    """skip_unreadable skips files Pillow cannot decode, not a failing pipeline."""
    write_image(str(tmp_path / 'fine.png'))
    ds = ImageFolder(data_root=str(tmp_path), skip_unreadable=True, pipeline=LOAD)

    def broken(results):
        raise KeyError('a bug in a transform')

    ds.pipeline = broken
    with pytest.raises(KeyError, match='a bug in a transform'):
        ds[0]
    assert not ds.skipped


def test_documented_cfg_options_turn_a_dino_config_to_a_plain_folder(tmp_path):
    """docs/dino.md's --cfg-options on the toy DINO config: images straight in PATH."""
    import argparse

    from mmengine.config import Config, DictAction
    from mmpretrain.registry import DATASETS
    for i in range(3):
        write_image(str(tmp_path / f'{i}.png'), seed=i, size=40)
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args([
        '--cfg-options', 'train_dataloader.dataset.type=ImageFolder',
        f'train_dataloader.dataset.data_root={tmp_path}',
        'train_dataloader.dataset.split='])
    cfg = Config.fromfile(osp.join(osp.dirname(__file__), '..', '..', 'configs', 'dino',
                                   'dino_dinovim-toy-p8_1xb8-10e_toy.py'))
    cfg.merge_from_dict(args.cfg_options)
    ds = DATASETS.build(cfg.train_dataloader.dataset)
    assert len(ds) == 3
    views = ds[0]['inputs']
    assert len(views) == 2 + 4 and views[0].shape == (3, 64, 64)  # the toy multi-crop
