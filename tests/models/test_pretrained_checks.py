"""Pretrained weights are checked where they are loaded: finite, and of the
model's shapes, with every key (``strict``) where the config asks.

- Non-finite weights went through ``init_cfg``, the teacher extraction and the
  converters; training then stopped at iteration 1 blaming the learning rate.
- mmengine's ``Pretrained`` initialiser (mmpretrain's ViT, the comparison's
  baseline) loaded 2 of a ViT's tensors from a wrong checkpoint, without an error.
"""
import argparse
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.model.weight_init import PretrainedInit
from mmengine.registry import DefaultScope

import mmdinomamba  # noqa: F401  (the checked Pretrained initialiser)
from mmdinomamba.models.checkpoint import CheckedPretrainedInit
from tests.factories import dinovim
from tests.helpers.converter_cli import assert_refused
from tests.helpers.toy_training import ENV, ROOT

COMPARE_VIT_PROBES = [
    'configs/compare/linear-probe_vit-d192-l12-p8_1xb128-30e_toy-rich.py',
    'configs/compare/linear-probe_vit-d192-l12-p4_1xb64-5e_toy-rich.py',
    'configs/linear_probe/vit-base-p16_4xb128-linear-coslr-100e_in1k.py',
]
TINY_VIT = dict(type='mmpretrain.VisionTransformer',
                arch=dict(embed_dims=16, num_layers=2, num_heads=2,
                          feedforward_channels=32),
                img_size=32, patch_size=16, drop_path_rate=0.0)


def tiny_vim(**kwargs):
    return dinovim(16, 2, img_size=32, mixer_cfg=dict(d_state=4, headdim=8),
                   drop_path_rate=0.0, **kwargs)


def with_nan(state, key):
    state = dict(state)
    state[key] = state[key].clone()
    state[key].view(-1)[0] = float('nan')
    return state


def vit(**kwargs):
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(dict(TINY_VIT, **kwargs))


def dino_file(tmp_path, backbone, name='dino.pth'):
    path = str(tmp_path / name)
    torch.save(dict(meta=dict(epoch=1), state_dict={
        **{f'teacher.backbone.{k}': v for k, v in backbone.items()},
        **{f'backbone.{k}': v for k, v in backbone.items()},
        'teacher.head.last_layer.weight': torch.zeros(4, 4)}), path)
    return path


# -- non-finite weights ----------------------------------------------------------------

def test_our_backbones_init_cfg_refuses_non_finite_weights(tmp_path):
    path = dino_file(tmp_path, with_nan(tiny_vim(seed=1).state_dict(),
                                        'layers.1.mixer.A_log'))
    model = tiny_vim(init_cfg=dict(type='Pretrained', checkpoint=path))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=f'{path}: 1 tensors hold NaN or infinite '
                       r'values: layers\.1\.mixer\.A_log'):
        model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key  # nothing was loaded


def test_analysis_loading_refuses_non_finite_weights(tmp_path):
    from mmdinomamba.analysis.loading import load_backbone
    path = str(tmp_path / 'inf.pth')
    state = tiny_vim(seed=1).state_dict()
    state['norm_f.weight'] = torch.full_like(state['norm_f.weight'], float('inf'))
    torch.save(state, path)
    cfg = dict(type='DinoVim', arch=dict(embed_dims=16, num_layers=2), img_size=32,
               mixer_cfg=dict(d_state=4, headdim=8))
    with pytest.raises(ValueError, match=f'{path}: 1 tensors hold NaN or infinite '
                       r'values: norm_f\.weight'):
        load_backbone(cfg, path)


def test_teacher_extraction_refuses_non_finite_weights(tmp_path, load_tool, capsys):
    tool = load_tool('tools/model_converters/extract_teacher.py')
    src = dino_file(tmp_path, with_nan(tiny_vim().state_dict(), 'pos_embed'))
    assert_refused(tool, src, str(tmp_path / 'out.pth'), capsys,
                   [f'{src} (teacher backbone): 1 tensors hold NaN or infinite values: '
                    'pos_embed'])


def test_dinomamba_converter_refuses_non_finite_weights(tmp_path, load_tool, capsys):
    tool = load_tool('tools/model_converters/dinomamba2mmdinomamba.py')
    state = with_nan(tiny_vim().state_dict(), 'layers.0.mixer.in_proj.weight')
    official = {f'module.backbone.{k}': v for k, v in state.items()}
    src = str(tmp_path / 'official.pth')
    torch.save({'teacher': official, 'student': official, 'epoch': 3,
                'args': argparse.Namespace(arch='vim_tiny')}, src)
    assert_refused(tool, src, str(tmp_path / 'out.pth'), capsys,
                   [f'{src}: 1 tensors hold NaN or infinite values: '
                    'layers.0.mixer.in_proj.weight'])


@pytest.mark.slow
def test_train_tool_names_non_finite_pretrained_weights_before_training(
        tmp_path, toy_root):
    """The stop came at iteration 1, blaming the learning rate; now the run fails
    at init, naming the file and the tensor (exit 1, nothing trained)."""
    from tests.engine.test_checkpoint_safety import PROBE
    cfg = Config.fromfile(PROBE)
    cfg.model.head.num_classes = cfg.data_preprocessor.num_classes = 2
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=toy_root,
                                   classes=osp.join(toy_root, 'classes.txt'))
        cfg[loader].num_workers = 0
    cfg.train_cfg.max_epochs = 1
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        backbone = MODELS.build(cfg.model.backbone).state_dict()
    src = dino_file(tmp_path, with_nan(backbone, 'layers.0.mixer.dt_bias'))
    cfg.model.backbone.init_cfg.checkpoint = src
    config = str(tmp_path / 'probe.py')
    cfg.dump(config)
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools/train.py'), config,
                           '--work-dir', str(tmp_path / 'work')],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert f'{src}: 1 tensors hold NaN or infinite values: layers.0.mixer.dt_bias' \
        in output
    assert 'Epoch(train)' not in output and 'learning rate' not in output


# -- mmengine's Pretrained, checked ------------------------------------------------------

def two_of_a_vit(tmp_path, own=None):
    """A wrong checkpoint that shares only [CLS] and the position table with the
    ViT ``own`` (another family's teacher under the same prefix)."""
    own = own or vit().state_dict()
    path = str(tmp_path / 'wrong.pth')
    torch.save(dict(state_dict={'teacher.backbone.cls_token': torch.ones_like(
        own['cls_token']), 'teacher.backbone.pos_embed': own['pos_embed'],
        'teacher.backbone.layers.0.mixer.A_log': torch.zeros(2)}), path)
    return path, len(own)


def test_control_mmengines_pretrained_loads_two_tensors_silently(tmp_path):
    path, total = two_of_a_vit(tmp_path)
    model = vit()
    PretrainedInit(checkpoint=path, prefix='teacher.backbone.')(model)
    assert torch.equal(model.cls_token, torch.ones_like(model.cls_token))


def test_pretrained_is_checked_and_strict_on_request(tmp_path):
    path, total = two_of_a_vit(tmp_path)
    model = vit(init_cfg=dict(type='Pretrained', checkpoint=path,
                              prefix='teacher.backbone.', strict=True))
    with pytest.raises(ValueError, match=f"does not cover VisionTransformer: "
                       f"{total - 2} of the model's {total} tensors missing: .*; "
                       '1 unexpected tensors: layers.0.mixer.A_log'):
        model.init_weights()
    assert not torch.equal(model.cls_token, torch.ones_like(model.cls_token))


def test_pretrained_refuses_shapes_and_non_finite_values_even_when_not_strict(tmp_path):
    source = vit().state_dict()
    wide = vit(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                         feedforward_channels=32)).state_dict()
    for name, state, message in (
            ('wide', wide, "does not fit VisionTransformer: .* of its .* tensors have "
             r'the wrong shape \(checkpoint vs model\): cls_token: \(1, 1, 32\) vs '
             r'\(1, 1, 16\)'),
            ('nan', with_nan(source, 'ln1.weight'),
             r'1 tensors hold NaN or infinite values: ln1\.weight')):
        path = str(tmp_path / f'{name}.pth')
        torch.save(dict(state_dict=state), path)
        model = vit()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(ValueError, match=message):
            CheckedPretrainedInit(path)(model)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_pretrained_loads_a_fitting_checkpoint_and_a_grid_of_another_size(tmp_path):
    source = vit(img_size=64).state_dict()  # 4 x 4 patches; the model has 2 x 2
    path = str(tmp_path / 'ok.pth')
    torch.save(dict(state_dict={f'module.{k}': v for k, v in source.items()}), path)
    model = vit(init_cfg=dict(type='Pretrained', checkpoint=path, strict=True))
    model.init_weights()
    for key, value in model.state_dict().items():
        if key != 'pos_embed':
            assert torch.equal(value, source[key]), key
    assert model.pos_embed.shape == (1, 5, 16)


@pytest.mark.parametrize('config', COMPARE_VIT_PROBES)
def test_vit_probe_configs_load_their_teacher_strictly(config, tmp_path):
    """The comparison's ViT baseline probe (and the ImageNet one) take every
    tensor of the teacher: a wrong checkpoint fails at init."""
    cfg = Config.fromfile(osp.join(ROOT, config))
    init = cfg.model.backbone.init_cfg
    assert init.type == 'Pretrained' and init.strict is True
    if 'base-p16' in config:
        return  # ViT-B: the key is what this test checks; no need to build it
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.model)
        path, _ = two_of_a_vit(tmp_path, model.backbone.state_dict())
        cfg.model.backbone.init_cfg.checkpoint = path
        model = MODELS.build(cfg.model)
    with pytest.raises(ValueError, match="does not cover VisionTransformer"):
        model.init_weights()
