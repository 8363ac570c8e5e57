"""BinaryAUC against sklearn's roc_auc_score and a literal threshold sweep.

Words -> paper letters: thresholds = N, num_fg / num_bg = foreground / background
pixel counts.
"""
import importlib
import json
import os
import socket
import time

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from mmengine.evaluator import Evaluator
from mmengine.structures import BaseDataElement, PixelData
from PIL import Image
from sklearn.metrics import roc_auc_score

from mmdinomamba.evaluation import (BinaryAUC, binary_auc, binary_auc_batch,
                                    foreground_mask, roc_curve, threshold_error_bound)

SIZE = 24


def random_case(seed, levels=None, size=SIZE):
    """A map correlated with a random mask; ``levels`` quantises it (ties)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(size, size, generator=g) < 0.35
    score = torch.randn(size, size, generator=g, dtype=torch.float64) + 0.8 * mask
    if levels is not None:
        score = torch.bucketize(score, torch.linspace(-1.5, 2.0, levels - 1))
        score = score.double() * 0.37 - 2.0
    return score, mask


def sweep_auc(score, mask, thresholds):
    """The paper's definition written out: one threshold at a time, numpy."""
    s = score.numpy().ravel()
    y = mask.numpy().ravel()
    s = (s - s.min()) / (s.max() - s.min())
    tpr, fpr = [0.0], [0.0]
    for t in np.linspace(0, 1, thresholds)[::-1]:
        tpr.append((s[y] >= t).mean())
        fpr.append((s[~y] >= t).mean())
    return float(np.trapezoid(tpr, fpr))


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('levels', [None, 2, 3, 8])
def test_exact_equals_sklearn(seed, levels):
    score, mask = random_case(seed, levels)
    expected = roc_auc_score(mask.numpy().ravel(), score.numpy().ravel())
    assert binary_auc(score, mask) == pytest.approx(expected, abs=1e-9)
    # float32 maps and 0/1 integer masks are accepted too
    assert binary_auc(score.float(), mask.long()) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize('levels', [None, 3])
def test_batch_equals_sklearn_and_the_single_map_function(levels):
    """Several maps per image, ties, ignored pixels and an image without
    foreground: every entry against sklearn on the valid pixels."""
    cases = [random_case(seed, levels) for seed in range(8)]
    maps = torch.stack([c[0] for c in cases]).reshape(4, 2, SIZE, SIZE)
    g = torch.Generator().manual_seed(9)
    fg = torch.rand(4, SIZE, SIZE, generator=g) < 0.4
    valid = torch.rand(4, SIZE, SIZE, generator=g) > 0.2
    fg[3] = False  # no foreground: nan
    maps[0, 1][~valid[0]] = float('nan')  # ignored pixels may hold anything
    out = binary_auc_batch(maps, fg, valid)
    assert out.shape == (4, 2) and out.dtype == torch.float64
    for b in range(3):
        keep = valid[b].numpy().ravel()
        for j in range(2):
            expected = roc_auc_score(fg[b].numpy().ravel()[keep],
                                     maps[b, j].numpy().ravel()[keep])
            assert out[b, j].item() == pytest.approx(expected, abs=1e-12)
            assert out[b, j].item() == binary_auc(maps[b, j], fg[b], valid[b])
    assert torch.isnan(out[3]).all()
    # without `valid`, every pixel is scored
    clean = maps.nan_to_num(0.0)
    full = binary_auc_batch(clean, fg)
    assert full[1, 0].item() == pytest.approx(
        roc_auc_score(fg[1].numpy().ravel(), clean[1, 0].numpy().ravel()), abs=1e-12)
    with pytest.raises(ValueError, match='non-finite'):
        binary_auc_batch(maps, fg)
    with pytest.raises(ValueError, match='num_maps'):
        binary_auc_batch(maps[0], fg)


@pytest.mark.parametrize('levels', [None, 5])
@pytest.mark.parametrize('thresholds', [2, 11, 50])
def test_threshold_mode_is_the_literal_sweep(levels, thresholds):
    score, mask = random_case(3, levels)
    assert binary_auc(score, mask, thresholds=thresholds) == pytest.approx(
        sweep_auc(score, mask, thresholds), abs=1e-12)
    fpr, tpr = roc_curve(score, mask, thresholds=thresholds)
    assert fpr.shape == tpr.shape == (thresholds + 1, )
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0, 0, 1, 1)
    assert (fpr.diff() >= 0).all() and (tpr.diff() >= 0).all()


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
@pytest.mark.parametrize('levels', [None, 6])
@pytest.mark.parametrize('thresholds', [100, 1000])
def test_threshold_mode_converges(seed, levels, thresholds):
    # The N-threshold trapezoid is the exact AUC of the scores quantised to the
    # grid k / (N - 1) (a fg/bg pair inside one bin counts 1/2). It can only be
    # wrong on pairs that share a bin without sharing a score, each by 1/2, so
    # |error| <= (pairs sharing a bin - pairs sharing a score) / (2 num_fg num_bg)
    # = threshold_error_bound. For min-max normalised scores with densities
    # f_fg, f_bg on [0, 1] that bound is about integral(f_fg f_bg) / (2 (N - 1));
    # our maps are two unit-variance Gaussians 0.8 apart spread over ~8 sigma, so
    # integral(f_fg f_bg) < 8 * 0.4 * 0.4 ~ 1.3 and the bound stays below
    # 1 / (N - 1) (factor ~1.5 of slack for sampling noise on 576 pixels).
    score, mask = random_case(seed, levels, size=48)
    exact = binary_auc(score, mask)
    error = abs(binary_auc(score, mask, thresholds=thresholds) - exact)
    bound = threshold_error_bound(score, mask, thresholds=thresholds)
    assert error <= bound + 1e-12
    assert bound <= 1 / (thresholds - 1)
    if levels is not None:
        # 6 levels sit on distinct grid bins: the sweep is exact
        assert bound == 0


@pytest.mark.parametrize('thresholds', [None, 2, 100])
def test_reference_maps(thresholds):
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[2:5, 3:7] = True
    assert binary_auc(mask.double(), mask, thresholds=thresholds) == 1.0
    assert binary_auc(-mask.double(), mask, thresholds=thresholds) == 0.0
    assert binary_auc(torch.full((8, 8), 3.0), mask, thresholds=thresholds) == 0.5


@pytest.mark.parametrize('thresholds', [None, 100])
def test_empty_or_full_foreground_is_nan(thresholds):
    score = torch.rand(6, 6)
    for fill in (False, True):
        mask = torch.full((6, 6), fill)
        assert np.isnan(binary_auc(score, mask, thresholds=thresholds))
        assert np.isnan(threshold_error_bound(score, mask))


def test_foreground_mask_and_ignore():
    label = torch.tensor([[0, 1, 2], [255, 3, 0]])
    fg, valid = foreground_mask(label, background_indices=(0, 3), ignore_index=255)
    assert fg.tolist() == [[False, True, True], [False, False, False]]
    assert valid.tolist() == [[True, True, True], [False, True, True]]
    _, valid = foreground_mask(label, ignore_index=None)
    assert valid.all()


@pytest.mark.parametrize('thresholds', [None, 20])
def test_ignored_pixels_count_for_nothing(thresholds):
    score, mask = random_case(4)
    ignore = torch.zeros_like(mask)
    ignore[:, :5] = True
    # ignored pixels hold extreme, adversarial scores: they must neither enter
    # the ranking nor the min-max normalisation
    adversarial = torch.where(ignore, torch.where(mask, -1e6, 1e6), score)
    got = binary_auc(adversarial, mask, valid=~ignore, thresholds=thresholds)
    expected = binary_auc(score[:, 5:], mask[:, 5:], thresholds=thresholds)
    assert got == pytest.approx(expected, abs=1e-12)
    if thresholds is None:
        keep = ~ignore.numpy().ravel()
        assert got == pytest.approx(roc_auc_score(
            mask.numpy().ravel()[keep], score.numpy().ravel()[keep]), abs=1e-9)


def test_pure_function_errors():
    score, mask = random_case(0)
    with pytest.raises(ValueError, match='shape'):
        binary_auc(score[:-1], mask)
    with pytest.raises(ValueError, match='valid shape'):
        binary_auc(score, mask, valid=mask[:-1])
    bad = score.clone()
    bad[0, 0] = float('nan')
    with pytest.raises(ValueError, match='non-finite'):
        binary_auc(bad, mask)
    # a non-finite value on an ignored pixel is fine
    valid = torch.ones_like(mask)
    valid[0, 0] = False
    assert 0 <= binary_auc(bad, mask, valid=valid) <= 1
    for thresholds in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match='thresholds'):
            binary_auc(score, mask, thresholds=thresholds)


def label_map(mask, fg_label=3):
    return torch.where(mask, fg_label, 0).long()


def evaluate(metric, samples, batch_size=2):
    evaluator = Evaluator(metric)
    for start in range(0, len(samples), batch_size):
        evaluator.process(samples[start:start + batch_size])
    return evaluator.evaluate(len(samples))


def test_metric_dict_samples_match_sklearn():
    samples, expected = [], []
    for seed in range(5):
        score, mask = random_case(seed)
        samples.append(dict(activation_map=score.float(), gt_seg_map=label_map(mask)))
        expected.append(roc_auc_score(mask.numpy().ravel(),
                                      score.float().numpy().ravel()))
    metrics = evaluate(BinaryAUC(), samples)
    assert metrics['binary_auc'] == pytest.approx(np.mean(expected), abs=1e-9)
    assert metrics['binary_auc/num_skipped'] == 0
    assert not any(k.startswith('binary_auc/head') for k in metrics)


def test_metric_seg_data_samples_heads_and_skips():
    g = torch.Generator().manual_seed(7)
    samples, per_head = [], []
    for seed in range(4):
        score, mask = random_case(seed)
        heads = torch.stack([score, -score, torch.rand(SIZE, SIZE, generator=g,
                                                       dtype=torch.float64)])
        label = label_map(mask)
        label[0, :] = 255
        samples.append(BaseDataElement(gt_sem_seg=PixelData(data=label[None]),
                                       activation_map=PixelData(data=heads)))
        keep = (label != 255).numpy().ravel()
        per_head.append([roc_auc_score(mask.numpy().ravel()[keep],
                                       h.numpy().ravel()[keep]) for h in heads])
    empty = torch.zeros(SIZE, SIZE, dtype=torch.long)
    full = torch.full((SIZE, SIZE), 5)
    full[:3] = 255  # ignored pixels do not count as background
    for label in (empty, full):
        samples.append(BaseDataElement(
            gt_sem_seg=PixelData(data=label[None]),
            activation_map=PixelData(data=torch.rand(3, SIZE, SIZE))))
    metrics = evaluate(BinaryAUC(), samples)
    expected = np.mean(per_head, 0)
    assert metrics['binary_auc/num_skipped'] == 2
    for i in range(3):
        assert metrics[f'binary_auc/head_{i}'] == pytest.approx(expected[i], abs=1e-6)
    assert metrics['binary_auc'] == pytest.approx(expected.mean(), abs=1e-6)
    assert metrics['binary_auc/head_0'] + metrics['binary_auc/head_1'] == \
        pytest.approx(1.0, abs=1e-6)
    # per_head=False scores the head-mean map
    mean_map = BinaryAUC(per_head=False, prefix='val')
    metrics = evaluate(mean_map, samples[:1])
    assert set(metrics) == {'val/binary_auc', 'val/binary_auc/num_skipped'}


def test_the_metric_names_its_keys_without_mmengine_s_prefix_warning():
    """mmengine warns "The prefix is not set" for a metric whose default prefix is
    None, once per run; the keys name themselves (``binary_auc...``)."""
    import logging

    from mmengine.logging import MMLogger
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        metric = BinaryAUC()
    finally:
        logger.removeHandler(handler)
    assert not [m for m in seen if 'prefix' in m], seen
    score, mask = random_case(0)
    sample = BaseDataElement(gt_sem_seg=PixelData(data=label_map(mask)[None]),
                             activation_map=PixelData(data=score[None]))
    assert set(evaluate(metric, [sample])) == {'binary_auc', 'binary_auc/num_skipped'}


def test_metric_resizes_low_resolution_maps():
    score, mask = random_case(5, size=8)
    label = label_map(F.interpolate(mask[None, None].float(), scale_factor=4)[0, 0] > 0)
    resized = F.interpolate(score[None, None].float(), size=(32, 32), mode='bilinear',
                            align_corners=False)[0, 0]
    expected = roc_auc_score(label.numpy().ravel() > 0, resized.numpy().ravel())
    metrics = evaluate(BinaryAUC(thresholds=None),
                       [dict(activation_map=score.float(), gt_seg_map=label)])
    assert metrics['binary_auc'] == pytest.approx(expected, abs=1e-9)


def test_metric_all_skipped_and_threshold_mode():
    metrics = evaluate(BinaryAUC(), [dict(activation_map=torch.rand(4, 4),
                                          gt_seg_map=torch.zeros(4, 4))])
    assert np.isnan(metrics['binary_auc']) and metrics['binary_auc/num_skipped'] == 1
    score, mask = random_case(6)
    metrics = evaluate(BinaryAUC(thresholds=11),
                       [dict(activation_map=score, gt_seg_map=label_map(mask))])
    expected = sweep_auc(score.float().double(), mask, 11)
    assert metrics['binary_auc'] == pytest.approx(expected, abs=1e-6)


def test_metric_errors():
    score, mask = random_case(0)
    good = dict(activation_map=score, gt_seg_map=label_map(mask))
    cases = [
        (dict(gt_seg_map=good['gt_seg_map']), 'no activation map.*available keys'),
        (dict(activation_map=score), 'no label map'),
        (dict(good, activation_map=torch.full_like(score, float('inf'))), 'non-finite'),
        (dict(good, activation_map=torch.rand(1, 2, 4, 4)), 'activation map must be'),
        (dict(good, gt_seg_map=torch.zeros(2, 4, 4)), 'label map must be'),
        (dict(good, gt_seg_map='labels.png'), 'not an array'),
        (BaseDataElement(gt_sem_seg=PixelData(data=label_map(mask)[None])),
         'no activation map.*gt_sem_seg'),
    ]
    for sample, message in cases:
        with pytest.raises(ValueError, match=message):
            BinaryAUC().process({}, [sample])
    with pytest.raises(ValueError, match='different head counts'):
        evaluate(BinaryAUC(), [dict(good, activation_map=torch.rand(2, 24, 24)),
                               dict(good, activation_map=torch.rand(3, 24, 24))])
    for kwargs, message in [(dict(thresholds=1), 'thresholds'),
                            (dict(pred_key=''), 'pred_key'),
                            (dict(gt_key=[]), 'gt_key'),
                            (dict(background_indices=(0, 255)), 'ignore_index'),
                            (dict(background_indices=('0', )), 'background_indices')]:
        with pytest.raises(ValueError, match=message):
            BinaryAUC(**kwargs)


def dist_samples():
    samples = []
    for seed in range(7):
        score, mask = random_case(seed)
        samples.append(dict(activation_map=torch.stack([score, score.exp()]),
                            gt_seg_map=label_map(mask)))
    samples.append(dict(activation_map=torch.rand(2, SIZE, SIZE),
                        gt_seg_map=torch.zeros(SIZE, SIZE, dtype=torch.long)))
    samples.append(samples[1])
    return samples


def _dist_worker(rank, world_size, port, out_file):
    # A forked child must not enter the OpenMP pool the parent already started
    # (it hangs); one thread, as torch's DataLoader workers do.
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    # mmengine.dist.init_dist('pytorch') calls torch.cuda.set_device, which
    # fails without a GPU; the mmengine.dist helpers work on any default group.
    torch_dist.init_process_group('gloo', rank=rank, world_size=world_size)
    samples = dist_samples()
    # DefaultSampler's shard: pad by wrapping around, then rank::world_size
    padded = samples + samples[:(-len(samples)) % world_size]
    shard = padded[rank::world_size]
    results = {}
    for device in ('cpu', 'gpu'):  # 'gpu' = collect through all_gather_object
        evaluator = Evaluator(BinaryAUC(thresholds=100, collect_device=device))
        evaluator.process(shard)
        results[device] = evaluator.evaluate(len(samples))
    if rank == 0:
        with open(out_file, 'w') as file:
            json.dump(results, file)
    torch_dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_distributed_matches_single_process(tmp_path):
    out_file = str(tmp_path / 'metrics.json')
    # fork, not spawn: spawned children re-import torch (~10 s on 2 CPU cores);
    # the parent holds no process group, and the workers run single-threaded.
    context = mp.start_processes(_dist_worker, args=(2, free_port(), out_file),
                                 nprocs=2, join=False, start_method='fork')
    deadline = time.monotonic() + 60
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail('distributed BinaryAUC workers did not finish in 60 s')
    with open(out_file) as file:
        results = json.load(file)
    single = evaluate(BinaryAUC(thresholds=100), dist_samples())
    assert single['binary_auc/num_skipped'] == 1
    for metrics in results.values():
        assert metrics.keys() == single.keys()
        for key, value in single.items():
            assert metrics[key] == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize('package', ['mmpretrain', 'mmseg'])
def test_registered_in_metrics(package):
    pytest.importorskip(package)
    from mmdinomamba.registry import register_all_modules
    register_all_modules()
    registry = importlib.import_module(f'{package}.registry').METRICS
    assert registry.get('BinaryAUC') is BinaryAUC
    metric = registry.build(dict(type='BinaryAUC', thresholds=100))
    assert isinstance(metric, BinaryAUC) and metric.thresholds == 100


def test_toy_dataset_cross_check(tmp_path):
    from mmdinomamba.datasets import make_toy_dataset
    root = make_toy_dataset(str(tmp_path / 'toy'), num_classes=3, train_per_class=1,
                            val_per_class=2, size=32, formats=['imagenet'])
    with open(os.path.join(root, 'meta', 'val.txt')) as file:
        stems = [line.split()[0] for line in file]
    g = torch.Generator().manual_seed(0)
    true_maps, noise_maps = [], []
    for stem in stems:
        ids = np.array(Image.open(os.path.join(root, 'masks', 'val', stem)), np.int64)
        label = torch.from_numpy(ids[..., 0] + 256 * ids[..., 1])
        true_maps.append(dict(activation_map=(label > 0).float(), gt_seg_map=label))
        noise_maps.append(dict(activation_map=torch.rand(32, 32, generator=g),
                               gt_seg_map=label))
    for thresholds in (None, 100):
        metrics = evaluate(BinaryAUC(thresholds=thresholds), true_maps)
        assert metrics['binary_auc'] == 1.0
        # 6 images x ~1000 pixels: the mean of chance AUCs is within ~0.02 of 0.5
        assert evaluate(BinaryAUC(thresholds=thresholds),
                        noise_maps)['binary_auc'] == pytest.approx(0.5, abs=0.06)
