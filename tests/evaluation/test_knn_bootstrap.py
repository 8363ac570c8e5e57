"""Weighted k-NN against a brute-force loop; bootstrap against a direct loop."""
import math

import numpy as np
import pytest
import torch

from mmdinomamba.evaluation import (bootstrap_ci, bootstrap_means, knn_accuracy,
                                    knn_classify)


def brute_force_knn(train, labels, query, k, temperature, num_classes):
    """DINO's vote, one query and one training image at a time, in float64."""
    preds = []
    for q in query.double().tolist():
        qn = math.sqrt(sum(v * v for v in q))
        sims = []
        for x, y in zip(train.double().tolist(), labels.tolist()):
            xn = math.sqrt(sum(v * v for v in x))
            sims.append((sum(a * b for a, b in zip(q, x)) / (qn * xn), y))
        sims.sort(key=lambda pair: -pair[0])
        votes = [0.0] * num_classes
        for s, y in sims[:k]:
            votes[y] += math.exp(s / temperature)
        preds.append(max(range(num_classes), key=lambda c: (votes[c], -c)))
    return preds


@pytest.mark.parametrize('num_train, k, temperature, chunk', [
    (50, 20, 0.07, 1024), (50, 5, 0.5, 7), (12, 20, 0.07, 3), (30, 1, 0.07, 4)])
def test_knn_matches_brute_force(num_train, k, temperature, chunk):
    gen = torch.Generator().manual_seed(num_train + k)
    num_classes = 4
    # class-dependent means so that votes are not all ties or all one class
    centres = torch.randn(num_classes, 8, generator=gen)
    labels = torch.randint(0, num_classes, (num_train, ), generator=gen)
    train = centres[labels] + 0.8 * torch.randn(num_train, 8, generator=gen)
    qlabels = torch.randint(0, num_classes, (23, ), generator=gen)
    query = (centres[qlabels] + 0.8 * torch.randn(23, 8, generator=gen)) * 3.0
    preds = knn_classify(train, labels, query, k, temperature, num_classes, chunk)
    expected = brute_force_knn(train, labels, query, min(k, num_train), temperature,
                               num_classes)
    assert preds.tolist() == expected
    hits = knn_accuracy(train, labels, query, qlabels, k, temperature)
    assert hits.tolist() == [float(p == y) for p, y in zip(expected, qlabels.tolist())]
    # not a degenerate case: the predictions vary
    assert len(set(expected)) > 1


def test_knn_temperature_changes_the_vote():
    # one very close neighbour of class 1 against three farther ones of class 0
    train = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6], [0.6, 0.8]])
    labels = torch.tensor([1, 0, 0, 0])
    query = torch.tensor([[1.0, 0.0]])
    # T small: exp(1/T) dominates; T large: the three votes win
    assert knn_classify(train, labels, query, k=4, temperature=0.02).tolist() == [1]
    assert knn_classify(train, labels, query, k=4, temperature=10.0).tolist() == [0]


@pytest.mark.parametrize('kwargs, message', [
    (dict(k=0), 'k must be'), (dict(temperature=0.0), 'temperature'),
    (dict(train=torch.zeros(3, 4)), 'same dim'),
    (dict(labels=torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0])), 'integer class ids'),
    (dict(labels=torch.tensor([0, 1])), 'train_labels must be'),
])
def test_knn_bad_input(kwargs, message):
    args = dict(train=torch.randn(5, 3), labels=torch.tensor([0, 1, 0, 1, 0]),
                query=torch.randn(2, 3), k=2, temperature=0.07)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        knn_classify(args['train'], args['labels'], args['query'], args['k'],
                     args['temperature'])


@pytest.mark.parametrize('level, num_resamples, seed', [(0.95, 500, 0), (0.8, 101, 3)])
def test_bootstrap_matches_direct_loop(level, num_resamples, seed):
    values = np.random.default_rng(7).random(37)
    values[[4, 9]] = np.nan
    ci = bootstrap_ci(torch.tensor(values), level, num_resamples, seed)
    kept = [v for v in values if not np.isnan(v)]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(kept), size=(num_resamples, len(kept)))
    means = sorted(sum(kept[j] for j in row) / len(kept) for row in draws)

    def percentile(q):  # numpy's default 'linear' rule
        pos = q / 100 * (len(means) - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (pos - lo) * (means[hi] - means[lo])

    assert ci.num == 35
    assert ci.mean == pytest.approx(sum(kept) / len(kept), abs=1e-12)
    assert ci.low == pytest.approx(percentile(50 * (1 - level)), abs=1e-12)
    assert ci.high == pytest.approx(percentile(50 * (1 + level)), abs=1e-12)
    assert ci.low < ci.mean < ci.high
    assert bootstrap_ci(values, level, num_resamples, seed) == ci  # seeded
    assert bootstrap_ci(values, level, num_resamples, seed + 1) != ci


def test_bootstrap_interval_narrows_with_more_images():
    rng = np.random.default_rng(0)
    small = bootstrap_ci(rng.random(20) < 0.5)
    large = bootstrap_ci(rng.random(2000) < 0.5)
    assert large.high - large.low < (small.high - small.low) / 4


@pytest.mark.parametrize('values, kwargs, message', [
    ([np.nan, np.nan], {}, 'no images'), ([], {}, 'no images'),
    (np.zeros((2, 2)), {}, '1-d'), ([1.0], dict(level=1.0), 'level'),
    ([1.0], dict(num_resamples=0), 'num_resamples')])
def test_bootstrap_bad_input(values, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(values, **kwargs)
    if 'level' not in kwargs:
        with pytest.raises(ValueError, match=message):
            bootstrap_means(values, **kwargs)
