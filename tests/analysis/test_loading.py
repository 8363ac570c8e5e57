"""load_backbone: config -> registry -> checked checkpoint load, for both parts."""
import os.path as osp

import pytest
import torch

from mmdinomamba.analysis import ActivationMapModel
from mmdinomamba.analysis.loading import backbone_config, load_backbone, load_config
from mmdinomamba.models import DinoVim

REPO = osp.join(osp.dirname(__file__), '..', '..')
BACKBONE = dict(type='DinoVim', arch=dict(embed_dims=16, num_layers=2), img_size=32,
                mixer_cfg=dict(d_state=4, headdim=8), drop_path_rate=0.0)
MODEL = dict(type='ActivationMapModel', backbone=BACKBONE,
             data_preprocessor=dict(type='ImgDataPreprocessor', mean=[0] * 3,
                                    std=[1] * 3))


def weights(seed):
    torch.manual_seed(seed)
    return DinoVim(**{k: v for k, v in BACKBONE.items() if k != 'type'}).state_dict()


@pytest.fixture()
def dino_checkpoint(tmp_path):
    teacher, student = weights(1), weights(2)
    path = str(tmp_path / 'epoch_1.pth')
    torch.save(dict(meta=dict(epoch=1), state_dict={
        **{f'backbone.{k}': v for k, v in student.items()},
        **{f'teacher.backbone.{k}': v for k, v in teacher.items()},
        'head.last_layer.weight': torch.zeros(2, 2)}), path)
    return path, teacher, student


def same(model, state):
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_backbone_and_model_parts(dino_checkpoint):
    path, teacher, student = dino_checkpoint
    backbone = load_backbone(BACKBONE, path)
    assert type(backbone) is DinoVim and same(backbone, teacher)
    assert same(load_backbone(BACKBONE, path, prefix='backbone.'), student)
    # a classifier-style config: model.backbone is built
    cfg = dict(model=dict(type='ImageClassifier', backbone=BACKBONE))
    assert same(load_backbone(cfg, path), teacher)
    # the whole model, the checkpoint going into its backbone (its weights_prefix)
    model = load_backbone(dict(MODEL, weights_prefix='backbone.'), path, part='model')
    assert isinstance(model, ActivationMapModel) and same(model.backbone, student)
    with pytest.raises(ValueError, match="choose one of \\('backbone', 'model'\\)"):
        load_backbone(BACKBONE, path, part='head')


def test_wrong_or_partial_checkpoints_fail_unless_not_strict(tmp_path):
    partial = {k: v for k, v in weights(1).items() if not k.startswith('layers.1.')}
    path = str(tmp_path / 'partial.pth')
    torch.save(partial, path)
    with pytest.raises(ValueError, match=r'missing keys .*layers\.1\.mixer\.A_log'):
        load_backbone(BACKBONE, path)
    loaded = load_backbone(BACKBONE, path, strict=False)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in partial.items())
    with pytest.raises(FileNotFoundError, match='does not exist'):
        load_backbone(BACKBONE, str(tmp_path / 'absent.pth'))


def test_config_forms():
    path = osp.join(REPO, 'configs', 'analysis', 'dinovim-mini_p16_128px.py')
    assert backbone_config(path) == backbone_config(load_config(path))
    assert backbone_config(BACKBONE) == BACKBONE
    assert load_config(path, dict(model=dict(img_size=64))).model.img_size == 64
    with pytest.raises(ValueError, match='a path, a Config or a dict'):
        load_config(3)
