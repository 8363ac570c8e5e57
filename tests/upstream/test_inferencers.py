"""The upstream inferencers on our configs: mmpretrain's
``ImageClassificationInferencer`` and ``FeatureExtractor``, mmseg's
``MMSegInferencer`` and mmdet's ``DetInferencer``, each given a config of ours as
a ``Config`` (mmseg and mmdet have no hub to look our names up in), a tiny model's
random weights as a checkpoint file, and one generated image file."""
import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba import zoo
from tests.helpers.dense_heads import two_stage_head_options, upernet_head_options

WIDTH = 32
# a 4-block, 32-wide DinoVim-T with four feature maps, from scratch
TINY_DENSE_BACKBONE = {'model.backbone.arch._delete_': True,
                       'model.backbone.arch.embed_dims': WIDTH,
                       'model.backbone.arch.num_layers': 4,
                       'model.backbone.out_indices': [0, 1, 2, 3],
                       'model.backbone.init_cfg': None,
                       'model.backbone.mixer_cfg.d_state': 16,
                       'model.backbone.mixer_cfg.headdim': 16}
HEIGHT, WIDTH_PX = 48, 64


@pytest.fixture(scope='module')
def image(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp('image') / 'image.png')
    pixels = np.random.default_rng(0).integers(0, 256, (HEIGHT, WIDTH_PX, 3), np.uint8)
    cv2.imwrite(path, pixels)
    return path


def random_weights(model: torch.nn.Module, path: str) -> dict:
    """Save ``model``'s (random) weights as an mmengine checkpoint; its state."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(dict(state_dict=state, meta=dict()), path)
    return state


def assert_loaded(model: torch.nn.Module, state: dict) -> None:
    loaded = model.state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k].cpu(), v) for k, v in state.items())


def classifier_config() -> Config:
    cfg = Config.fromfile(zoo.config_path('linear_probe',
                                          'dinovim-toy-p8_1xb16-linear-10e_toy.py'))
    cfg.model.backbone.init_cfg = None
    return cfg


def test_mmpretrain_inferencers_on_a_linear_probe(image, tmp_path):
    from mmpretrain import FeatureExtractor, ImageClassificationInferencer, get_model
    cfg = classifier_config()
    torch.manual_seed(0)
    ckpt = str(tmp_path / 'probe.pth')
    state = random_weights(get_model(cfg), ckpt)
    classes = [f'class_{i}' for i in range(4)]
    inferencer = ImageClassificationInferencer(cfg, pretrained=ckpt, classes=classes,
                                               device='cpu')
    assert_loaded(inferencer.model, state)
    result, = inferencer(image)
    assert len(result['pred_scores']) == 4
    assert float(np.sum(result['pred_scores'])) == pytest.approx(1.0, abs=1e-5)
    assert result['pred_label'] == int(np.argmax(result['pred_scores']))
    assert result['pred_class'] == classes[result['pred_label']]
    assert result['pred_score'] == pytest.approx(max(result['pred_scores']))

    extractor = FeatureExtractor(cfg, pretrained=ckpt, device='cpu')
    assert_loaded(extractor.model, state)
    features, = extractor(image)
    # the concatenated [CLS] readouts of the last 2 of 4 blocks, 64 wide each
    assert [tuple(f.shape) for f in features] == [(2 * 64, )]
    assert torch.isfinite(features[0]).all()


def tiny_upernet(tmp_path):
    """The DinoVim-T UperNet config with the tiny backbone and head, testing at the
    image's size, and a checkpoint of its random weights: (config, path, state)."""
    from mmseg.registry import MODELS
    cfg = Config.fromfile(zoo.config_path(
        'upernet', 'upernet_dinovim-tiny-p16_8xb2-160k_ade20k-512x512.py'))
    cfg.merge_from_dict({**TINY_DENSE_BACKBONE, **upernet_head_options(WIDTH),
                         'test_dataloader.dataset.pipeline.1.scale': (HEIGHT, WIDTH_PX)})
    torch.manual_seed(0)
    ckpt = str(tmp_path / 'upernet.pth')
    return cfg, ckpt, random_weights(MODELS.build(cfg.model), ckpt)


def test_mmseg_inferencer_on_an_upernet_config(image, tmp_path):
    from mmseg.apis import MMSegInferencer
    cfg, ckpt, state = tiny_upernet(tmp_path)
    inferencer = MMSegInferencer(model=cfg, weights=ckpt, device='cpu')
    assert_loaded(inferencer.model, state)
    result = inferencer(image)
    prediction = np.asarray(result['predictions'])
    assert prediction.shape == (HEIGHT, WIDTH_PX)
    assert prediction.min() >= 0 and prediction.max() < 150  # ADE20K's classes


def test_det_inferencer_on_a_cascade_mask_rcnn_config(image, tmp_path):
    from mmdet.apis import DetInferencer
    from mmdet.registry import MODELS
    cfg = Config.fromfile(zoo.config_path(
        'cascade_mask_rcnn', 'cascade-mask-rcnn_dinovim-tiny-p16_fpn_1x_coco.py'))
    cfg.merge_from_dict({**TINY_DENSE_BACKBONE,
                         **two_stage_head_options(WIDTH, 2, ('.0', '.1', '.2')),
                         'test_dataloader.dataset.pipeline.1.scale': (WIDTH_PX, HEIGHT)})
    torch.manual_seed(0)
    ckpt = str(tmp_path / 'cascade.pth')
    state = random_weights(MODELS.build(cfg.model), ckpt)
    inferencer = DetInferencer(model=cfg, weights=ckpt, device='cpu', palette='random')
    assert_loaded(inferencer.model, state)
    result = inferencer(image, out_dir='')
    prediction, = result['predictions']
    n = len(prediction['labels'])
    assert n > 0  # score_thr 0: an untrained head keeps its boxes
    assert len(prediction['scores']) == len(prediction['masks']) == n
    assert np.asarray(prediction['bboxes']).shape == (n, 4)
    assert all(0 <= label < 2 for label in prediction['labels'])
    boxes = np.asarray(prediction['bboxes'])
    assert (boxes[:, 2:] >= boxes[:, :2]).all()
    assert (boxes[:, [0, 2]] <= WIDTH_PX + 1e-3).all()
    assert (boxes[:, [1, 3]] <= HEIGHT + 1e-3).all()
