"""ActivationMapModel: predictions, checkpoint weight selection, registration."""
import importlib

import pytest
import torch
from mmengine.structures import BaseDataElement

from mmdinomamba.analysis import ActivationMapModel, activation_maps
from mmdinomamba.models import DinoVim

BACKBONE = dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2), img_size=32,
                patch_size=8, mixer_cfg=dict(d_state=8, headdim=8, chunk_size=16),
                drop_path_rate=0.0)


def backbone(seed):
    torch.manual_seed(seed)
    cfg = dict(BACKBONE)
    cfg.pop('type')
    return DinoVim(**cfg)


def model(seed=0, **kwargs):
    return ActivationMapModel(backbone(seed), **kwargs).eval()


def images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_predict_writes_the_maps_into_each_sample():
    m = model(layer=0)
    samples = [BaseDataElement(gt_seg_map=torch.zeros(32, 32)) for _ in range(2)]
    out = m(images(), samples, mode='predict')
    expected = activation_maps(m.backbone, images(), layer=0).heads
    assert expected.shape == (2, 8, 32, 32)  # 8 SSD heads, image size
    for sample, heads in zip(out, expected):
        assert 'gt_seg_map' in sample
        torch.testing.assert_close(sample.activation_map, heads, rtol=0, atol=0)
    torch.testing.assert_close(m(images(), mode='tensor'), expected, rtol=0, atol=0)
    assert len(m(images())) == 2  # samples are created when none are given


def prefixed(state, prefix):
    return {prefix + k: v for k, v in state.items()}


@pytest.mark.parametrize('layout', ['dino', 'classifier', 'bare'])
def test_checkpoint_weights_are_selected(layout):
    teacher, student = backbone(1).state_dict(), backbone(2).state_dict()
    state = {
        # a DINO checkpoint holds the student as backbone.* and the teacher
        'dino': {**prefixed(student, 'backbone.'),
                 **prefixed(teacher, 'teacher.backbone.'),
                 'head.last_layer.weight': torch.ones(3)},
        'classifier': {**prefixed(teacher, 'backbone.'),
                       'head.fc.weight': torch.ones(3)},
        'bare': teacher,
    }[layout]
    m = model(seed=0)
    m.load_state_dict(state)
    for key, value in teacher.items():
        torch.testing.assert_close(m.backbone.state_dict()[key], value, rtol=0, atol=0)
    # an explicit prefix wins over the automatic order
    m = model(seed=0, weights_prefix='backbone.')
    if layout == 'dino':
        m.load_state_dict(state)
        torch.testing.assert_close(m.backbone.pos_embed, student['pos_embed'])


def test_checkpoint_without_the_backbone_raises():
    teacher = backbone(1).state_dict()
    incomplete = prefixed(teacher, 'backbone.')
    del incomplete['backbone.norm_f.weight']
    with pytest.raises(ValueError, match='lacks 1 backbone tensors'):
        model().load_state_dict(incomplete)
    with pytest.raises(ValueError, match='no DinoVim tensors'):
        model().load_state_dict({'encoder.weight': torch.ones(1)})


def test_bad_options_raise():
    cases = [(dict(method='gradcam'), 'cosine'), (dict(layer=5), 'out of range'),
             (dict(layer=1.0), 'int'), (dict(feature_source='stream'), 'mixer')]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(**kwargs)
    with pytest.raises(ValueError, match='evaluation-only'):
        model()(images(), mode='loss')
    with pytest.raises(ValueError, match='tensor'):
        model()(images(), mode='features')


@pytest.mark.parametrize('package', ['mmpretrain', 'mmseg'])
def test_registered_and_built_from_config(package):
    pytest.importorskip(package)
    from mmengine.registry import DefaultScope

    from mmdinomamba.registry import register_all_modules
    register_all_modules()
    registry = importlib.import_module(f'{package}.registry').MODELS
    assert registry.get('ActivationMapModel') is ActivationMapModel
    # the backbone config is built in the current default scope
    with DefaultScope.overwrite_default_scope(package):
        built = registry.build(dict(type='ActivationMapModel', backbone=BACKBONE,
                                    data_preprocessor=dict(type='ImgDataPreprocessor',
                                                           mean=[0] * 3, std=[1] * 3)))
    assert isinstance(built.backbone, DinoVim)
