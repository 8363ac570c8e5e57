"""Loading backbone weights: every key accounted for, no silent partial loads.

The same rules hold for ``init_cfg=dict(type='Pretrained', ...)`` on our backbones
and for :func:`mmdinomamba.models.checkpoint.load_backbone_checkpoint`.
"""
import pytest
import torch

from mmdinomamba.models import LinearViT
from mmdinomamba.models.backbones import resize_pos_embed
from mmdinomamba.models.checkpoint import (BACKBONE_PREFIXES, key_report,
                                           load_backbone_checkpoint)
from tests.factories import dinovim

ARCH = dict(embed_dims=16, num_layers=2)
MIXER = dict(d_state=4, headdim=8)


def vim(seed=0, **kwargs):
    return dinovim(**ARCH, seed=seed, **dict(dict(img_size=32, mixer_cfg=MIXER,
                                                  drop_path_rate=0.0), **kwargs))


def saved(tmp_path, obj, name='ckpt.pth'):
    path = str(tmp_path / name)
    torch.save(obj, path)
    return path


def pretrained(path, **kwargs):
    model = vim(seed=5, init_cfg=dict(type='Pretrained', checkpoint=path, **kwargs))
    model.init_weights()
    return model


def assert_loaded(model, state):
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)


def timm_like(source):
    """timm ViT names: its embeddings carry DinoVim's names and shapes, its blocks
    and final norm do not."""
    state = {k: source[k] for k in ('cls_token', 'pos_embed', 'patch_embed.proj.weight',
                                    'patch_embed.proj.bias')}
    state.update({'blocks.0.attn.qkv.weight': torch.zeros(48, 16),
                  'norm.weight': torch.ones(16), 'head.weight': torch.zeros(3, 16)})
    return state


def test_partial_checkpoint_fails_naming_every_missing_key(tmp_path):
    source = vim(seed=1).state_dict()
    path = saved(tmp_path, timm_like(source))
    with pytest.raises(ValueError, match='does not cover DinoVim') as info:
        pretrained(path)
    message = str(info.value)
    missing = sorted(set(source) - set(timm_like(source)))
    assert f'{len(missing)} missing keys' in message
    assert all(key in message for key in missing)
    assert 'strict=False' in message  # the opt-out is named
    # opting out loads what is there, keeps the rest, and says so
    model = pretrained(path, strict=False)
    torch.testing.assert_close(model.cls_token, source['cls_token'], rtol=0, atol=0)
    torch.testing.assert_close(model.layers[0].mixer.in_proj.weight,
                               vim(seed=5).layers[0].mixer.in_proj.weight, rtol=0, atol=0)
    assert not torch.equal(model.layers[0].mixer.in_proj.weight,
                           source['layers.0.mixer.in_proj.weight'])


def test_unexpected_backbone_keys_fail(tmp_path):
    """A deeper model's checkpoint covers a shallower one, but its extra blocks are
    unexpected keys inside the backbone's namespace: that is a wrong checkpoint."""
    deep = vim(seed=1, arch=dict(embed_dims=16, num_layers=3)).state_dict()
    path = saved(tmp_path, deep)
    with pytest.raises(ValueError, match=r'unexpected keys: layers\.2\.'):
        pretrained(path)
    report = key_report(vim(), deep)
    assert report.missing == [] and report.ignored == []
    assert report.unexpected == sorted(k for k in deep if k.startswith('layers.2.'))
    assert_loaded(pretrained(path, strict=False), deep)


def test_other_parts_of_a_model_are_ignored_and_shapes_always_checked(tmp_path):
    source = vim(seed=1).state_dict()
    # a classifier head next to bare backbone keys (the official plain layout)
    path = saved(tmp_path, {**source, 'head.weight': torch.zeros(3, 16)})
    assert_loaded(pretrained(path), source)
    wrong = dict(source)
    wrong['layers.0.mixer.D'] = torch.zeros(5)
    path = saved(tmp_path, wrong, 'wrong.pth')
    for strict in (True, False):
        with pytest.raises(ValueError, match=r'layers\.0\.mixer\.D: \(5,\) vs \(4,\)'):
            pretrained(path, strict=strict)


def test_pos_embed_of_another_grid_is_resized(tmp_path):
    source = vim(seed=1, img_size=64).state_dict()  # 4 x 4 grid, this model 2 x 2
    model = pretrained(saved(tmp_path, source))
    expected = resize_pos_embed(source['pos_embed'], (4, 4), (2, 2), num_prefix=1)
    torch.testing.assert_close(model.pos_embed, expected, rtol=0, atol=0)


def test_dino_and_extract_teacher_checkpoints_load_strictly(tmp_path, load_tool):
    teacher, student = vim(seed=1).state_dict(), vim(seed=2).state_dict()
    state = {**{f'backbone.{k}': v for k, v in student.items()},
             **{f'teacher.backbone.{k}': v for k, v in teacher.items()},
             'head.last_layer.weight': torch.zeros(3, 3), 'loss_module.center':
             torch.zeros(1, 3)}
    dino = saved(tmp_path, dict(meta=dict(epoch=1), state_dict=state), 'dino.pth')
    # the linear-probe configs name the prefix; without it the teacher is found first
    assert_loaded(pretrained(dino, prefix='teacher.backbone.'), teacher)
    assert_loaded(pretrained(dino), teacher)
    assert_loaded(pretrained(dino, prefix='backbone'), student)  # '.' added
    assert BACKBONE_PREFIXES[0] == 'teacher.backbone.'
    # extract_teacher.py's output, as the dense and probe configs load it
    extract = load_tool('tools/model_converters/extract_teacher.py')
    out = str(tmp_path / 'teacher.pth')
    extract.main([dino, out])
    assert_loaded(pretrained(out), teacher)
    model = vim(seed=5)
    assert load_backbone_checkpoint(model, out) == ''
    assert_loaded(model, teacher)


def test_linear_vit_and_bad_init_cfg(tmp_path):
    torch.manual_seed(0)
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_ratio=2)
    source = LinearViT(arch=arch, img_size=32).state_dict()
    path = saved(tmp_path, {f'backbone.{k}': v for k, v in source.items()})
    model = LinearViT(arch=arch, img_size=32,
                      init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    assert_loaded(model, source)
    with pytest.raises(ValueError, match=r"unknown keys \['stict'\]"):
        pretrained(path, stict=False)
    with pytest.raises(ValueError, match='no DinoVim tensors'):
        pretrained(saved(tmp_path, {'encoder.w': torch.zeros(1)}, 'other.pth'))
    with pytest.raises(FileNotFoundError, match='does not exist'):
        pretrained(str(tmp_path / 'absent.pth'))
