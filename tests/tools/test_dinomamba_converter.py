"""tools/model_converters/dinomamba2mmdinomamba.py: the official layout is checked,
wrong checkpoints exit non-zero naming what is wrong, good ones load strictly."""

import pytest
import torch

from mmdinomamba.models import DinoVim
from tests.factories import dinovim
from tests.helpers.converter_cli import assert_refused
from tests.helpers.reference_data import MAMBAR, VIM, reference_path

DIM = 16


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/model_converters/dinomamba2mmdinomamba.py')


def tiny_vim(**kwargs):
    return dinovim(DIM, 2, img_size=32, mixer_cfg=dict(d_state=4, headdim=8),
                   drop_path_rate=0.0, **kwargs)


def timm_vit():
    """The key layout and shapes of timm's VisionTransformer (1 block, width 16,
    patch 16, 32 px): its cls_token, pos_embed and patch_embed have the very names
    and shapes of a DinoVim."""
    d = DIM
    state = {'cls_token': torch.randn(1, 1, d), 'pos_embed': torch.randn(1, 5, d),
             'patch_embed.proj.weight': torch.randn(d, 3, 16, 16),
             'patch_embed.proj.bias': torch.randn(d),
             'norm.weight': torch.ones(d), 'norm.bias': torch.zeros(d),
             'head.weight': torch.randn(10, d), 'head.bias': torch.zeros(10)}
    for name, shape in (('norm1.weight', (d, )), ('norm1.bias', (d, )),
                        ('attn.qkv.weight', (3 * d, d)), ('attn.qkv.bias', (3 * d, )),
                        ('attn.proj.weight', (d, d)), ('attn.proj.bias', (d, )),
                        ('norm2.weight', (d, )), ('norm2.bias', (d, )),
                        ('mlp.fc1.weight', (4 * d, d)), ('mlp.fc1.bias', (4 * d, )),
                        ('mlp.fc2.weight', (d, 4 * d)), ('mlp.fc2.bias', (d, ))):
        state[f'blocks.0.{name}'] = torch.randn(shape)
    return state


def torchvision_vit():
    from torchvision.models import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                             hidden_dim=DIM, mlp_dim=32).state_dict()


def own_dino_checkpoint():
    """What tools/train.py writes for DINO: the student and the teacher."""
    backbone = tiny_vim().state_dict()
    state = {**{f'backbone.{k}': v for k, v in backbone.items()},
             **{f'teacher.backbone.{k}': v for k, v in backbone.items()},
             'head.last_layer.weight': torch.zeros(4, 4),
             'teacher.head.last_layer.weight': torch.zeros(4, 4)}
    return dict(meta=dict(epoch=1), state_dict=state)


WRONG = {
    'timm ViT': (timm_vit, ['no `layers.{i}.*` blocks', 'norm_f.weight',
                            'blocks.0.attn.qkv.weight']),
    'torchvision ViT': (torchvision_vit, ['no `layers.{i}.*` blocks', 'cls_token',
                                          'conv_proj.weight', 'class_token']),
    'random tensors': (lambda: {f'w{i}': torch.randn(3) for i in range(4)},
                       ['no `layers.{i}.*` blocks', 'pos_embed', 'w0']),
    'own DINO checkpoint': (own_dino_checkpoint, ['mmdinomamba DINO training '
                                                  'checkpoint', 'extract_teacher.py']),
}


@pytest.mark.parametrize('case', sorted(WRONG))
def test_wrong_checkpoints_exit_nonzero_naming_the_problem(case, tmp_path, capsys,
                                                           tool):
    build, messages = WRONG[case]
    src, dst = str(tmp_path / 'src.pth'), str(tmp_path / 'dst.pth')
    torch.save(build(), src)
    assert_refused(tool, src, dst, capsys, messages)


def test_layout_problems_are_named(tool):
    good = tiny_vim().state_dict()
    assert tool.validate(good) == dict(embed_dims=DIM, num_layers=2, num_registers=0,
                                       patch_size=16)
    gap = {k: v for k, v in good.items() if not k.startswith('layers.0.')}
    with pytest.raises(ValueError, match=r'not numbered 0\.\.0: found \[1\]'):
        tool.validate(gap)
    short = dict(good)
    del short['layers.1.mixer.A_log_b']
    with pytest.raises(ValueError, match=r'1 required keys missing: layers\.1\.mixer'
                       r'\.A_log_b'):
        tool.convert(short)
    wide = dict(good)
    wide['layers.1.mixer.D'] = torch.ones(5)
    with pytest.raises(ValueError, match=r'layers\.1\.mixer\.D \(5,\), expected '):
        tool.convert(wide)
    extra = dict(good, **{'layers.0.mixer.gate.weight': torch.ones(1)})
    with pytest.raises(ValueError, match=r'unexpected keys: layers\.0\.mixer\.gate'):
        tool.convert(extra)
    reg = tiny_vim(num_registers=2).state_dict()
    assert tool.validate(reg)['num_registers'] == 2


@pytest.mark.parametrize('name,registers', [(VIM, 0), (MAMBAR, 12)])
def test_official_fixture_converts_and_loads_strictly(name, registers, tmp_path,
                                                      capsys, tool):
    src, dst = reference_path(name), str(tmp_path / 'backbone.pth')
    tool.main([src, dst])
    assert f'4 blocks, {registers} registers' in capsys.readouterr().out
    model = DinoVim(arch=dict(embed_dims=256, num_layers=4), num_registers=registers,
                    init_cfg=dict(type='Pretrained', checkpoint=dst))
    model.init_weights()  # strict by default: it would raise on any missing key
    state = torch.load(dst)
    assert sorted(state) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)
