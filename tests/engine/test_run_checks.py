"""Errors that name the problem and the fix (mmdinomamba.engine.run_checks, the
CPU-distributed BatchNorm check, a failed write)."""
import glob
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.runner import Runner

import mmdinomamba  # noqa: F401  (registers our classes)
import mmdinomamba.engine.run_checks as run_checks
from mmdinomamba.engine import build_checked_loop, check_config_keys
from mmdinomamba.engine.distributed import require_batch_statistics

from tests.helpers.configs import leaf_configs, load
from tests.helpers.toy_training import ENV, ROOT, tiny_dino_config

PROBE = osp.join(ROOT, 'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py')


# -- config keys -----------------------------------------------------------------------

def test_a_top_level_typo_is_named_with_the_closest_key(monkeypatch):
    logged = []
    monkeypatch.setattr(run_checks, 'print_log', lambda msg, **kw: logged.append(msg))
    cfg = Config(dict(model=dict(type='X'), randomnes=dict(seed=1), data_root='d',
                      train_pipeline=[]))
    assert check_config_keys(cfg) == [
        "config key 'randomnes' is not read by the Runner; did you mean 'randomness'?"]
    # the same typo from --cfg-options (randomnes.seed=1), on a config without it
    cfg = Config(dict(model=dict(type='X'), data_root='d'))
    keys = list(cfg.keys())
    cfg.merge_from_dict({'randomnes.seed': 1, 'data_root': 'e'})
    assert check_config_keys(cfg, keys) == [
        "--cfg-options: 'randomnes' is a new top-level key that nothing reads; did you "
        "mean 'randomness'?"]
    assert logged == [
        "config key 'randomnes' is not read by the Runner; did you mean 'randomness'?",
        "--cfg-options: 'randomnes' is a new top-level key that nothing reads; did you "
        "mean 'randomness'?"]


def test_no_shipped_config_has_a_suspicious_key():
    paths = leaf_configs()
    assert len(paths) > 70
    flagged = {p: check_config_keys(load(p)) for p in paths}
    assert {p: m for p, m in flagged.items() if m} == {}


# -- data that cannot train or test ------------------------------------------------------

def probe_config(data_root, work_dir, num_classes=2):
    cfg = Config.fromfile(PROBE)
    cfg.work_dir = str(work_dir)
    cfg.model.head.num_classes = cfg.data_preprocessor.num_classes = num_classes
    cfg.model.backbone.init_cfg = None
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=data_root,
                                   classes=osp.join(data_root, 'classes.txt'))
        cfg[loader].num_workers = 0
    cfg.log_level = 'WARNING'
    return cfg


def runner_of(cfg, name):
    cfg.experiment_name = name
    return Runner.from_cfg(cfg)


def test_a_dataset_smaller_than_one_batch_is_named(toy_root, tmp_path):
    cfg = tiny_dino_config(toy_root, str(tmp_path), max_epochs=1, num_workers=0)
    cfg.train_dataloader.batch_size = 32  # 16 images, drop_last=True
    with pytest.raises(ValueError, match=r'train_dataloader\.dataset \(type=.ImageNet., '
                       r'data_root=.*\) gives no batch: 16 samples \(16 per process\) '
                       r'are fewer than one batch of 32.*--cfg-options '
                       r'train_dataloader\.batch_size=16'):
        build_checked_loop(runner_of(cfg, 'small-dataset'), 'train')


@pytest.mark.parametrize('mode', ['train', 'test'])
def test_missing_data_names_the_path_and_the_fixes(tmp_path, monkeypatch, mode):
    """The toy config run where no data was made: the dataset, the missing folder,
    where relative paths are read from, the option that moves the data root and
    the command that makes the toy data (was: a bare No such file or directory)."""
    monkeypatch.chdir(tmp_path)
    cfg = probe_config('data/toy', tmp_path / 'work')
    with pytest.raises(FileNotFoundError) as err:
        build_checked_loop(runner_of(cfg, f'missing-{mode}'), mode)
    message = str(err.value)
    assert message.startswith(f"{mode}_dataloader.dataset (type='ImageNet', "
                              "data_root='data/toy'")
    # (the classifier's dataset reads its class list first)
    assert f"'data/toy/classes.txt' does not exist (relative paths are read from " \
        f'{tmp_path})' in message
    assert f'--cfg-options {mode}_dataloader.dataset.data_root=PATH' in message
    assert 'python tools/make_toy_data.py data/toy' in message


def test_an_empty_annotation_list_is_named(toy_root, tmp_path):
    (tmp_path / 'empty.txt').write_text('')
    cfg = tiny_dino_config(toy_root, str(tmp_path), max_epochs=1, num_workers=0)
    cfg.train_dataloader.dataset.ann_file = str(tmp_path / 'empty.txt')
    with pytest.raises(ValueError, match=r"ann_file='.*empty\.txt'.*\) holds no samples "
                       r'\(an empty annotation list'):
        build_checked_loop(runner_of(cfg, 'empty-dataset'), 'train')


@pytest.mark.parametrize('mode', ['train', 'test'])
def test_a_head_for_another_class_count_is_refused(toy_root, tmp_path, mode):
    cfg = probe_config(toy_root, tmp_path, num_classes=4)  # the toy data has 2
    with pytest.raises(ValueError, match=r'model\.head\.num_classes is 4, but '
                       rf'{mode}_dataloader\.dataset .* has 2 classes .*--cfg-options '
                       r'model\.head\.num_classes=2'):
        build_checked_loop(runner_of(cfg, f'classes-{mode}'), mode)


def imagenet_folder_config(data_root, work_dir, num_classes):
    """The probe on an ImageNet-type folder without a class list: the dataset keeps
    mmpretrain's 1000 ImageNet names, while its samples carry the folder labels."""
    cfg = probe_config(data_root, work_dir, num_classes)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.pop('classes')
        cfg[loader].dataset.type = 'ImageNet'
    return cfg


def test_a_head_that_fits_the_labels_of_an_imagenet_folder_trains(toy_root, tmp_path):
    runner = runner_of(imagenet_folder_config(toy_root, tmp_path, 2), 'folder-labels')
    loop = build_checked_loop(runner, 'train')
    assert len(loop.dataloader.dataset.metainfo['classes']) == 1000
    assert {loop.dataloader.dataset.get_data_info(i)['gt_label']
            for i in range(len(loop.dataloader.dataset))} == {0, 1}


def test_a_head_smaller_than_the_labels_is_refused(toy_root, tmp_path):
    cfg = imagenet_folder_config(toy_root, tmp_path, 1)
    with pytest.raises(ValueError, match=r'model\.head\.num_classes is 1, but '
                       r'train_dataloader\.dataset .* has labels up to 1: set '
                       r'--cfg-options model\.head\.num_classes=2'):
        build_checked_loop(runner_of(cfg, 'labels-beyond-head'), 'train')


@pytest.mark.parametrize('workers', [0, pytest.param(1, marks=pytest.mark.slow)])
def test_an_empty_image_file_is_named(toy_root, tmp_path, workers):
    root = tmp_path / 'toy'
    shutil.copytree(toy_root, root)
    broken = sorted(glob.glob(str(root / 'val' / '*' / '*.png')))[0]
    open(broken, 'wb').close()
    cfg = probe_config(str(root), tmp_path)
    cfg.test_dataloader.num_workers = workers
    loop = build_checked_loop(runner_of(cfg, f'empty-image-{workers}'), 'test')
    with pytest.raises(ValueError, match=f'cannot read {broken}: cv2.error: .*buf.empty'
                       r'.* \(an empty or corrupt file\?'):
        for _ in loop.dataloader:
            pass


def test_the_checked_loop_is_the_one_training_uses(toy_root, tmp_path):
    cfg = probe_config(toy_root, tmp_path)
    runner = runner_of(cfg, 'same-loop')
    loop = build_checked_loop(runner, 'train')
    assert runner.train_loop is loop and len(loop.dataloader) == 1
    sample = loop.dataloader.dataset[0]
    assert sample['inputs'].shape == (3, 64, 64)


# -- CPU-distributed BatchNorm -------------------------------------------------------------

def test_per_process_batchnorm_names_the_layer_and_the_fix():
    from mmengine.model import revert_sync_batchnorm
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1),
                          nn.SyncBatchNorm(4))
    names = [n for n, m in model.named_modules() if isinstance(m, nn.SyncBatchNorm)]
    model = revert_sync_batchnorm(model)
    require_batch_statistics(model, names)
    model(torch.randn(2, 3, 8, 8))  # two images: two values per channel
    with pytest.raises(ValueError, match=r'2: BatchNorm \(SyncBN on GPUs, per-process '
                       r'BN on the CPU\) got one value per channel \(input \(1, 4, 1, '
                       r'1\)\).*train_dataloader\.batch_size >= 2'):
        model(torch.randn(1, 3, 8, 8))
    model.eval()
    model(torch.randn(1, 3, 8, 8))  # evaluation uses the running statistics


def test_the_cpu_ddp_wrapper_installs_the_check(tmp_path):
    import torch.distributed as dist

    from mmdinomamba.engine import CPUDistributedDataParallel
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0,
                            world_size=1)
    try:
        model = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.SyncBatchNorm(3))
        wrapped = CPUDistributedDataParallel(model, device_ids=None)
        with pytest.raises(ValueError, match=r'^1: BatchNorm'):
            wrapped(torch.randn(1, 3, 4, 4))
    finally:
        dist.destroy_process_group()


# -- a failed write --------------------------------------------------------------------------

FULL_DISK = """
import resource, signal, sys, torch
from mmdinomamba.utils import save_atomic
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
resource.setrlimit(resource.RLIMIT_FSIZE, (200000, resource.RLIM_INFINITY))
save_atomic({'state_dict': {'w': torch.zeros(500000)}}, sys.argv[1])
"""


@pytest.mark.slow
def test_a_write_that_runs_out_of_space_names_the_file(tmp_path):
    """A write limit stands in for a full disk (InitialWeightsHook's init.pth gave
    'unexpected pos 524288 vs 524176')."""
    path = tmp_path / 'init.pth'
    proc = subprocess.run([sys.executable, '-c', FULL_DISK, str(path)], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f'writing {path} failed:' in proc.stderr, proc.stderr[-3000:]
    assert 'MiB free on its file system; a full disk fails this way' in proc.stderr
    assert os.listdir(tmp_path) == []  # no partial file, no temporary file


# -- labels outside the head's classes, the class-count fix, top-k -----------------

def with_labels(cfg, tmp_path, loader, changes):
    """``cfg``'s ``loader`` reading a copy of the toy annotation list of its split
    with ``changes`` ({line index: new label}) made."""
    dataset = cfg[loader].dataset
    split = 'train' if loader == 'train_dataloader' else 'val'
    with open(osp.join(dataset.data_root, 'meta', f'{split}.txt')) as f:
        lines = f.read().split('\n')
    for index, label in changes.items():
        lines[index] = f'{lines[index].rsplit(" ", 1)[0]} {label}'
    path = tmp_path / f'{loader}.txt'
    path.write_text('\n'.join(lines))
    dataset.update(ann_file=str(path), data_prefix=split)
    return lines


@pytest.mark.parametrize('loader,mode', [('train_dataloader', 'train'),
                                         ('val_dataloader', 'train'),
                                         ('test_dataloader', 'test')])
def test_a_label_outside_the_head_is_named_before_the_run(toy_root, tmp_path, loader,
                                                          mode):
    """As found: with the class count matching (2 classes, a 2-class head) the label
    check was skipped; a label 7 then raised a raw IndexError mid-epoch in training,
    and was silently scored as wrong in validation and test."""
    cfg = probe_config(toy_root, tmp_path / 'work', num_classes=2)
    lines = with_labels(cfg, tmp_path, loader, {1: 7})
    where = loader.split('_')[0]
    with pytest.raises(ValueError) as err:
        build_checked_loop(runner_of(cfg, f'label-{loader}-{mode}'), mode)
    message = str(err.value)
    assert message.startswith(f'model.head.num_classes is 2, but {where}_dataloader.'
                              'dataset (type=')
    assert 'has labels up to 7: correct the annotation list (ann_file): its labels ' \
        'must be class indices 0..1 of the 2 classes the dataset lists, or set ' \
        '--cfg-options model.head.num_classes=8 and the classes.' in message
    first = lines[1].rsplit(' ', 1)[0]
    assert message.endswith(f'1 of {len([x for x in lines if x])} samples have labels '
                            f'outside 0..1 (7); the first is '
                            f'{osp.join(toy_root, "train" if where == "train" else "val", first)}')


def test_a_negative_label_is_named(toy_root, tmp_path):
    cfg = probe_config(toy_root, tmp_path / 'work', num_classes=2)
    with_labels(cfg, tmp_path, 'train_dataloader', {0: -1})
    with pytest.raises(ValueError, match=r'model\.head\.num_classes is 2, but '
                       r'train_dataloader\.dataset .* has negative labels: correct the '
                       r'annotation list .* samples have labels outside 0\.\.1 \(-1\)'):
        build_checked_loop(runner_of(cfg, 'negative-label'), 'train')


def test_the_class_count_fix_is_the_dataset_s_not_the_subset_s(toy_root, tmp_path):
    """As found: an ImageNet head (1000) on the toy set, two iterations of its first
    samples (all of class 0), suggested num_classes=1; the fix is the dataset's
    class count."""
    cfg = probe_config(toy_root, tmp_path / 'work', num_classes=1000)
    cfg.train_dataloader.dataset.indices = 4  # the first 4: all of class 0
    cfg.train_dataloader.batch_size = 2
    with pytest.raises(ValueError, match=r'model\.head\.num_classes is 1000, but '
                       r'train_dataloader\.dataset .* has 2 classes \(c000_ellipse, '
                       r'c001_rectangle\): set --cfg-options model\.head\.num_classes=2'):
        build_checked_loop(runner_of(cfg, 'subset-classes'), 'train')
    # the dataset's own count, on that subset, trains
    cfg = probe_config(toy_root, tmp_path / 'work2', num_classes=2)
    cfg.train_dataloader.dataset.indices = 4
    cfg.train_dataloader.batch_size = 2
    build_checked_loop(runner_of(cfg, 'subset-ok'), 'train')


@pytest.mark.parametrize('mode', ['train', 'test'])
def test_top_k_follows_the_class_count(toy_root, tmp_path, mode, monkeypatch):
    """mmpretrain's Accuracy(topk=(1, 5)) on a 2-class head failed (top-5 of 2
    scores); its top-k is clamped to the classes, with one logged line."""
    logged = []
    monkeypatch.setattr(run_checks, 'print_log',
                        lambda message, **kwargs: logged.append(message))
    cfg = probe_config(toy_root, tmp_path / 'work', num_classes=2)
    cfg.val_evaluator = cfg.test_evaluator = dict(type='Accuracy', topk=(1, 5))
    runner = runner_of(cfg, f'topk-{mode}')
    build_checked_loop(runner, mode)
    loop = runner.test_loop if mode == 'test' else runner.val_loop
    metric, = loop.evaluator.metrics
    assert metric.topk == (1, 2)
    assert logged == ['Accuracy: topk=(1, 5) on a 2-class head; measuring topk=(1, 2) '
                      "(set the evaluator's topk to choose)"]


def test_an_image_folder_list_s_labels_are_checked_too(toy_root, tmp_path):
    """ImageFolder (no get_gt_labels): the labels of its annotation list."""
    cfg = probe_config(toy_root, tmp_path / 'work', num_classes=2)
    with_labels(cfg, tmp_path, 'train_dataloader', {2: 3})
    dataset = cfg.train_dataloader.dataset
    dataset.type = 'ImageFolder'
    dataset.split = dataset.pop('data_prefix')
    dataset.pop('classes')
    with pytest.raises(ValueError, match=r"model\.head\.num_classes is 2, but "
                       r"train_dataloader\.dataset \(type='ImageFolder'.* has labels up "
                       r'to 3: set --cfg-options model\.head\.num_classes=4 .*1 of 16 '
                       r'samples have labels outside 0\.\.1 \(3\)'):
        build_checked_loop(runner_of(cfg, 'folder-labels-range'), 'train')


def test_missing_validation_data_is_named_before_training(toy_root, tmp_path):
    """The validation data is now read before the first epoch: missing, it is
    named as the training data is."""
    cfg = probe_config(toy_root, tmp_path / 'work', num_classes=2)
    cfg.val_dataloader.dataset.update(data_root=str(tmp_path / 'nowhere'),
                                      classes=osp.join(toy_root, 'classes.txt'))
    with pytest.raises(FileNotFoundError, match=r"^val_dataloader\.dataset \(type="
                       r"'ImageNet', data_root='.*nowhere'.*does not exist.*--cfg-options "
                       r'val_dataloader\.dataset\.data_root=PATH'):
        build_checked_loop(runner_of(cfg, 'missing-val'), 'train')
