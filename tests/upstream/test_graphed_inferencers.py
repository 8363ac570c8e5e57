"""mmdinomamba.apis: the upstream inferencers with the backbone's blocks replayed
from CUDA graphs on a GPU. On a CPU they are the upstream ones (same results, no
runner set); with the model on CUDA (faked on the CPU by the ``on_cuda`` check,
real in the ``gpu`` tests) the inference runners are set with the given bounds,
and ``cuda_graphs=False`` leaves the model eager."""
import numpy as np
import pytest
import torch

import mmdinomamba.apis as apis
from tests.upstream.test_inferencers import image  # noqa: F401  (a fixture)
from tests.upstream.test_inferencers import (classifier_config, random_weights,
                                             tiny_upernet)


def test_on_a_cpu_the_inferencer_is_the_upstream_one(image, tmp_path):
    from mmseg.apis import MMSegInferencer
    cfg, ckpt, _ = tiny_upernet(tmp_path)
    ours = apis.MMSegInferencer(model=cfg, weights=ckpt, device='cpu')
    assert isinstance(ours, MMSegInferencer) and ours.graphed_modules == []
    assert ours.model.backbone.stack_runner is None
    upstream = MMSegInferencer(model=cfg, weights=ckpt, device='cpu')
    np.testing.assert_array_equal(np.asarray(ours(image)['predictions']),
                                  np.asarray(upstream(image)['predictions']))


def test_on_cuda_the_inference_runners_are_set(image, tmp_path, monkeypatch):
    monkeypatch.setattr(apis, 'on_cuda', lambda model: True)
    cfg = classifier_config()
    from mmpretrain import get_model
    ckpt = str(tmp_path / 'probe.pth')
    random_weights(get_model(cfg), ckpt)
    ours = apis.ImageClassificationInferencer(cfg, pretrained=ckpt, device='cpu',
                                              max_signatures=3, capture_after=1)
    assert ours.graphed_modules == ['backbone']
    blocks = ours.model.backbone.stack_runner.graphs
    assert (blocks.training, blocks.evict, blocks.max_signatures,
            blocks.capture_after) == (False, True, 3, 1)
    off = apis.FeatureExtractor(cfg, pretrained=ckpt, device='cpu', cuda_graphs=False)
    assert off.graphed_modules == [] and off.model.backbone.stack_runner is None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match='no attribute'):
        apis.SegInferencer


@pytest.mark.gpu
def test_on_a_gpu_the_segmentation_inferencer_replays_graphs_with_eager_numbers(
        image, tmp_path):
    """Three calls on one image: eager, captured (capture_after 2), replayed; the
    logits equal the eager inferencer's exactly (the same kernels)."""
    cfg, ckpt, _ = tiny_upernet(tmp_path)
    ours = apis.MMSegInferencer(model=cfg, weights=ckpt, device='cuda')
    eager = apis.MMSegInferencer(model=cfg, weights=ckpt, device='cuda',
                                 cuda_graphs=False)
    assert ours.graphed_modules == ['backbone'] and eager.graphed_modules == []
    blocks = ours.model.backbone.stack_runner.graphs
    want = eager(image, return_datasamples=True).seg_logits.data
    for calls in range(1, 4):
        got = ours(image, return_datasamples=True).seg_logits.data
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert len(blocks._graphs) == (calls >= 2)
    assert eager.model.backbone.stack_runner is None


@pytest.mark.gpu
def test_on_a_gpu_the_classifier_and_feature_extractor_replay_graphs(image, tmp_path):
    from mmpretrain import get_model
    cfg = classifier_config()
    ckpt = str(tmp_path / 'probe.pth')
    random_weights(get_model(cfg), ckpt)
    ours = apis.ImageClassificationInferencer(cfg, pretrained=ckpt, device='cuda',
                                              capture_after=1)
    eager = apis.ImageClassificationInferencer(cfg, pretrained=ckpt, device='cuda',
                                               cuda_graphs=False)
    for _ in range(2):
        got, = ours(image)
        want, = eager(image)
        np.testing.assert_array_equal(got['pred_scores'], want['pred_scores'])
    assert len(ours.model.backbone.stack_runner.graphs._graphs) == 1
    features = apis.FeatureExtractor(cfg, pretrained=ckpt, device='cuda',
                                     capture_after=1)
    plain = apis.FeatureExtractor(cfg, pretrained=ckpt, device='cuda', cuda_graphs=False)
    for _ in range(2):
        torch.testing.assert_close(features(image)[0][0], plain(image)[0][0],
                                   rtol=0, atol=0)
    assert len(features.model.backbone.stack_runner.graphs._graphs) == 1
