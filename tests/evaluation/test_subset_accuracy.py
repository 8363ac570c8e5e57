"""SubsetAccuracy (ImageNet-A / -R scoring) against a brute-force loop."""

import pytest
import torch
from mmengine.evaluator import Evaluator

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.datasets.imagenet_wnids import IMAGENET_WNIDS
from mmdinomamba.datasets.robustness import ImageNetA, ImageNetR
from mmdinomamba.evaluation.subset_accuracy import SubsetAccuracy, subset_predictions

from tests.helpers.robustness_data import make_wnid_folders


def brute_force_accuracy(scores, labels, subset):
    """Percent correct: per image, the subset class with the largest score."""
    correct = 0
    for score, label in zip(scores.tolist(), labels):
        best = None
        for c in subset:
            if best is None or score[c] > score[best]:
                best = c
        correct += best == label
    return 100.0 * correct / len(labels)


def samples(scores, labels):
    return [dict(pred_score=s, gt_label=torch.tensor([y])) for s, y in zip(scores, labels)]


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    subset = sorted(torch.randperm(1000, generator=gen)[:7].tolist())
    labels = [subset[i] for i in torch.randint(0, 7, (40, ), generator=gen)]
    scores = torch.randn(40, 1000, generator=gen)
    # give half the images their own class as the largest score in the subset
    for i in range(0, 40, 2):
        scores[i, labels[i]] = scores[i, subset].max() + 0.1
    metric = SubsetAccuracy()
    metric.dataset_meta = dict(imagenet_subset=subset)
    for start in range(0, 40, 16):
        metric.process({}, samples(scores[start:start + 16], labels[start:start + 16]))
    result = metric.evaluate(40)
    assert result['subset/top1'] == pytest.approx(
        brute_force_accuracy(scores, labels, subset), abs=1e-9)
    assert result['subset/images'] == 40
    assert result['subset/top1'] >= 50.0


def test_restriction_ignores_classes_outside_the_subset():
    subset = [3, 10, 500]
    scores = torch.zeros(2, 1000)
    scores[:, 7] = 9.0  # the unrestricted top-1, never a subset class
    scores[0, 10] = 1.0
    scores[1, 500] = 2.0
    assert subset_predictions(scores, subset).tolist() == [10, 500]
    assert subset_predictions(scores.softmax(1), subset).tolist() == [10, 500]


def test_on_a_generated_imagenet_r_through_the_evaluator(tmp_path):
    counts = {1: 2, 200: 3, 640: 1, 998: 2}
    make_wnid_folders(str(tmp_path), counts)
    dataset = ImageNetR(data_root=str(tmp_path))
    evaluator = Evaluator(dict(type='mmpretrain.SubsetAccuracy'))
    evaluator.dataset_meta = dataset.metainfo
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(len(dataset), 1000, generator=gen)
    labels = [dataset.get_data_info(i)['gt_label'] for i in range(len(dataset))]
    scores[0, labels[0]] = 50.0
    evaluator.process(samples(scores, labels))
    # the reference takes the subset from the folder names, not the metainfo
    folders = sorted(IMAGENET_WNIDS.index(w) for w in
                     (p.name for p in tmp_path.iterdir() if p.is_dir()))
    assert evaluator.evaluate(len(dataset))['subset/top1'] == pytest.approx(
        brute_force_accuracy(scores, labels, folders), abs=1e-9)


def test_needs_the_subset_in_the_dataset_meta():
    metric = SubsetAccuracy()
    metric.dataset_meta = dict(classes=('a', 'b'))
    with pytest.raises(ValueError, match='imagenet_subset'):
        metric.process({}, samples(torch.zeros(1, 2), [0]))


def test_label_outside_the_subset_is_an_error(tmp_path):
    make_wnid_folders(str(tmp_path), {4: 1})
    metric = SubsetAccuracy()
    metric.dataset_meta = ImageNetA(data_root=str(tmp_path)).metainfo
    with pytest.raises(ValueError, match=r'labels \[5\]'):
        metric.process({}, samples(torch.zeros(1, 1000), [5]))


@pytest.mark.parametrize('subset, match', [([], 'non-empty'), ([1, 1], 'repeated'),
                                           ([0, 1000], r'\[0, 1000\)')])
def test_bad_subsets(subset, match):
    with pytest.raises(ValueError, match=match):
        subset_predictions(torch.zeros(2, 1000), subset)
