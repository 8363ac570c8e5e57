"""ReaLAccuracy against a per-image loop, on generated ImageNet val layouts."""
import json
import os.path as osp
import random

import pytest
import torch
from mmengine.evaluator import Evaluator
from mmpretrain.datasets import ImageNet

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.evaluation.real import ReaLAccuracy, load_real_labels, val_image_index

from tests.helpers.robustness_data import make_real_json, make_val_set

NUM_IMAGES = 24


def random_real(seed, num_images=NUM_IMAGES, num_classes=1000):
    """Label lists of 0-3 classes each; every fifth image has none."""
    rng = random.Random(seed)
    return [[] if k % 5 == 2 else
            rng.sample(range(num_classes), rng.randint(1, 3)) for k in range(num_images)]


def loop_reference(preds_by_index, real):
    """ReaL top-1 and the excluded count, one image at a time."""
    correct = scored = excluded = 0
    for index, pred in preds_by_index.items():
        if len(real[index]) == 0:
            excluded += 1
            continue
        scored += 1
        if pred in real[index]:
            correct += 1
    return 100.0 * correct / scored, excluded


def samples_for(dataset, paths, preds_by_index):
    """Data samples of the dataset's images, in dataset order; ``paths[k]`` is the
    generated image of entry k."""
    index_of = {osp.normpath(path): k for k, path in enumerate(paths)}
    out = []
    for i in range(len(dataset)):
        path = dataset.get_data_info(i)['img_path']
        pred = preds_by_index[index_of[osp.normpath(path)]]
        out.append(dict(img_path=path, pred_label=torch.tensor([pred])))
    return out


@pytest.fixture
def val_set(tmp_path, request):
    labels = [random.Random(k).randrange(1000) for k in range(NUM_IMAGES)]
    paths = make_val_set(str(tmp_path), labels, flat=request.param)
    real = random_real(seed=7)
    make_real_json(str(tmp_path / 'real.json'), real)
    dataset = ImageNet(data_root=str(tmp_path), split='val')
    return dataset, paths, real, str(tmp_path / 'real.json')


@pytest.mark.parametrize('val_set', [False, True], ids=['class-folders', 'flat-meta'],
                         indirect=True)
def test_matches_a_per_image_loop(val_set):
    dataset, paths, real, real_file = val_set
    order = [osp.normpath(dataset.get_data_info(i)['img_path']) for i in range(len(dataset))]
    assert sorted(order) == sorted(map(osp.normpath, paths)) and order != paths
    rng = random.Random(11)
    # half the predictions are taken from the image's list, so matching the wrong
    # entry to an image would change the score
    preds = {k: rng.choice(real[k]) if real[k] and k % 2 else rng.randrange(1000)
             for k in range(NUM_IMAGES)}
    evaluator = Evaluator(dict(type='mmpretrain.ReaLAccuracy', real_file=real_file))
    samples = samples_for(dataset, paths, preds)
    for start in range(0, len(samples), 5):
        evaluator.process(samples[start:start + 5])
    result = evaluator.evaluate(len(dataset))
    top1, excluded = loop_reference(preds, real)
    assert result['real/top1'] == pytest.approx(top1, abs=1e-9)
    assert result['real/excluded'] == excluded == sum(not r for r in real)
    assert result['real/scored'] == NUM_IMAGES - excluded


def test_images_with_empty_lists_are_excluded_not_wrong(tmp_path):
    real = [[1], [], [2, 3], []]
    make_real_json(str(tmp_path / 'real.json'), real)
    metric = ReaLAccuracy(real_file=str(tmp_path / 'real.json'))
    metric.process({}, [dict(img_path=f'v/ILSVRC2012_val_{k + 1:08d}.JPEG',
                             pred_label=torch.tensor([p])) for k, p in enumerate([1, 9, 3, 9])])
    assert metric.evaluate(4) == {'real/top1': 100.0, 'real/scored': 2, 'real/excluded': 2}


def test_val_index_from_the_file_name():
    assert val_image_index('data/imagenet/val/n01440764/ILSVRC2012_val_00000293.JPEG') == 292
    for bad in ('ILSVRC2012_val_00000000.JPEG', 'val_1.JPEG', 'ILSVRC2012_val_0001.JPEG'):
        with pytest.raises(ValueError, match='ILSVRC2012_val_NNNNNNNN'):
            val_image_index(bad)


def test_length_must_equal_the_val_set(tmp_path):
    make_real_json(str(tmp_path / 'real.json'), [[1]] * 3)
    metric = ReaLAccuracy(real_file=str(tmp_path / 'real.json'))
    metric.process({}, [dict(img_path='ILSVRC2012_val_00000001.JPEG',
                             pred_label=torch.tensor([1]))])
    with pytest.raises(ValueError, match='has 3 entries but the evaluated val set has 4'):
        metric.evaluate(4)


def test_image_beyond_the_labels_is_named(tmp_path):
    make_real_json(str(tmp_path / 'real.json'), [[1]] * 3)
    metric = ReaLAccuracy(real_file=str(tmp_path / 'real.json'))
    with pytest.raises(ValueError, match='val image 7, but .* only 3 entries'):
        metric.process({}, [dict(img_path='ILSVRC2012_val_00000007.JPEG',
                                 pred_label=torch.tensor([1]))])


def test_missing_labels_file(tmp_path):
    with pytest.raises(FileNotFoundError, match='real.json'):
        ReaLAccuracy(real_file=str(tmp_path / 'real.json'))


@pytest.mark.parametrize('content, match', [
    ({'a': 1}, 'JSON list'), ([[1], 2], 'entry 1'), ([[1000]], 'entry 0'),
    ([[True]], 'entry 0'), ([[-1]], 'entry 0')])
def test_malformed_labels_file(tmp_path, content, match):
    path = tmp_path / 'real.json'
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=match):
        load_real_labels(str(path))
