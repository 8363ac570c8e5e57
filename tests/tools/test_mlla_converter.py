"""tools/model_converters/mlla2mmdinomamba.py and the same conversion in init_cfg:
every official tensor but ``rotations`` maps to exactly one of ours, wrong files
fail naming what does not match."""
import os.path as osp

import pytest
import torch

from mmdinomamba.models import MLLA
from mmdinomamba.models.backbones.mlla_official import official_layout, read_arch
from tests.helpers import checkpoint_files
from tests.factories import MLLA_SMALL
from tests.helpers.converter_cli import assert_refused
from tests.helpers.reference_data import MLLA as MLLA_REFERENCE
from tests.helpers.reference_data import load_reference

SMALL = MLLA_SMALL  # the official fixture's


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/model_converters/mlla2mmdinomamba.py')


@pytest.fixture(scope='module')
def official():
    return load_reference(MLLA_REFERENCE)


def classifier(**backbone):
    from mmpretrain.registry import MODELS
    import mmdinomamba  # noqa: F401
    return MODELS.build(dict(
        type='ImageClassifier',
        backbone=dict(type='MLLA', arch=SMALL, drop_path_rate=0.0, **backbone),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=10, in_channels=96)))


def without_rotations(state):
    return {k: v for k, v in state.items() if not k.endswith('rope.rotations')}


@pytest.mark.parametrize('rotations', [True, False], ids=['with', 'without'])
def test_every_tensor_maps_to_exactly_one_of_ours(official, tool, rotations):
    state = official['state_dict'] if rotations else without_rotations(
        official['state_dict'])
    assert any(k.endswith('rope.rotations') for k in state) == rotations
    converted = tool.convert(state)
    ours = classifier().state_dict()
    assert set(converted) == set(ours)  # none missing, none left over
    assert all(converted[k].shape == ours[k].shape for k in ours)
    # each official tensor (rotations aside) is one converted tensor, and back
    kept = without_rotations(official['state_dict'])
    assert len(kept) == len(converted)
    ids = {id(v): k for k, v in converted.items()}
    assert sorted(ids[id(v)] for v in kept.values()) == sorted(converted)
    assert converted['backbone.norm3.weight'] is kept['norm.weight']
    assert converted['head.fc.bias'] is kept['head.bias']
    assert converted['backbone.layers.2.blocks.1.attn.qk.weight'] is \
        kept['layers.2.blocks.1.attn.qk.weight']


def test_the_layout_is_the_official_classes(official):
    """official_layout, written from the official key layout, equals the fixture's
    keys and shapes (the official class's state_dict, rotations aside)."""
    kept = without_rotations(official['state_dict'])
    layout = official_layout(**read_arch(kept))
    assert list(layout) == list(kept)
    assert all(tuple(kept[k].shape) == layout[k] for k in layout)


def wrap(state, kind):
    if kind == 'model':
        return dict(model=state, optimizer={}, epoch=3, max_accuracy=1.0)
    if kind == 'state_dict_ema':
        return dict(state_dict_ema=state, epoch=3)
    if kind == 'state_dict':
        return dict(state_dict=state, meta={})
    return dict(state)


@pytest.mark.parametrize('kind', ['model', 'state_dict_ema', 'state_dict', 'bare'])
def test_cli_says_which_weights_it_used(official, tool, tmp_path, capsys, kind):
    src, dst = str(tmp_path / 'official.pth'), str(tmp_path / 'converted.pth')
    torch.save(wrap(official['state_dict'], kind), src)
    tool.main([src, dst])
    used = 'bare state dict' if kind == 'bare' else kind
    assert f'converted {used!r}' in capsys.readouterr().out
    saved = torch.load(dst, weights_only=True)
    classifier().load_state_dict(saved['state_dict'])  # strict
    assert saved['meta']['weights'] == used


def test_ema_is_chosen_on_request(official, tool, tmp_path, capsys):
    ema = {k: v + 1 if v.is_floating_point() else v
           for k, v in official['state_dict'].items()}
    src, dst = str(tmp_path / 'official.pth'), str(tmp_path / 'converted.pth')
    torch.save(dict(model=official['state_dict'], state_dict_ema=ema), src)
    tool.main([src, dst, '--ema'])
    assert "converted 'state_dict_ema'" in capsys.readouterr().out
    out = torch.load(dst, weights_only=True)['state_dict']
    torch.testing.assert_close(out['head.fc.bias'], ema['head.bias'])
    tool.main([src, dst])
    assert "converted 'model'" in capsys.readouterr().out
    torch.save(dict(model=official['state_dict']), src)
    with pytest.raises(SystemExit):
        tool.main([src, dst, '--ema'])
    assert 'has no state_dict_ema' in capsys.readouterr().err


def swin_like():
    d = 8
    return {'patch_embed.proj.weight': torch.randn(d, 3, 4, 4),
            'layers.0.blocks.0.attn.qkv.weight': torch.randn(3 * d, d),
            'norm.weight': torch.ones(d), 'head.weight': torch.randn(10, d)}


class NotATensor:
    """Stands for the yacs config object of official training checkpoints."""


def damaged(official, change):
    state = without_rotations(official['state_dict'])
    if change == 'missing':
        del state['layers.1.blocks.0.cpe2.bias']
    elif change == 'extra':
        state['layers.1.blocks.0.attn.gate.weight'] = torch.ones(3)
    elif change == 'shape':
        state['layers.2.blocks.1.dwc.weight'] = torch.ones(48, 1, 5, 5)
    elif change == 'nan':
        state['layers.1.blocks.0.cpe2.bias'] = torch.full_like(
            state['layers.1.blocks.0.cpe2.bias'], float('nan'))
    return state


WRONG = {
    'swin-like': (lambda official: swin_like(),
                  ['not an official MLLA checkpoint', 'patch_embed.conv3.1.conv.weight']),
    'DinoVim': (lambda official: {'patch_embed.proj.weight': torch.ones(4, 3, 16, 16),
                                  'layers.0.mixer.A_log': torch.ones(2)},
                ['not an official MLLA checkpoint']),
    'ours already': (lambda official: {'state_dict': classifier().state_dict()},
                     ['not an official MLLA checkpoint']),
    'missing key': (lambda official: damaged(official, 'missing'),
                    ['1 missing keys: layers.1.blocks.0.cpe2.bias']),
    'extra key': (lambda official: damaged(official, 'extra'),
                  ['1 unexpected keys: layers.1.blocks.0.attn.gate.weight']),
    'wrong shape': (lambda official: damaged(official, 'shape'),
                    ['layers.2.blocks.1.dwc.weight (48, 1, 5, 5), expected '
                     '(48, 1, 3, 3)']),
    'non-finite': (lambda official: damaged(official, 'nan'),
                   ['1 tensors hold NaN or infinite values: '
                    'layers.1.blocks.0.cpe2.bias']),
    'pickled object': (lambda official: dict(model=official['state_dict'],
                                             config=NotATensor()),
                       ['refusing to load', 'NotATensor', 'which are not data']),
}


@pytest.mark.parametrize('case', sorted(WRONG))
def test_wrong_checkpoints_fail_naming_the_problem(official, tool, tmp_path, capsys,
                                                   case):
    build, messages = WRONG[case]
    src, dst = str(tmp_path / 'src.pth'), str(tmp_path / 'dst.pth')
    torch.save(build(official), src)
    assert_refused(tool, src, dst, capsys, messages)


def test_missing_file_is_named(tool, tmp_path, capsys):
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path / 'nope.pth'), str(tmp_path / 'out.pth')])
    assert 'nope.pth can not be found' in capsys.readouterr().err


def test_init_cfg_converts_an_official_file(official, tmp_path):
    """The backbone's Pretrained init reads the official file as it is (weights
    under 'model', rotations included) and reproduces the official features."""
    src = str(tmp_path / 'official.pth')
    torch.save(dict(model=official['state_dict'], epoch=300), src)
    model = classifier(init_cfg=dict(type='Pretrained', checkpoint=src))
    model.init_weights()
    data = official['cases'][1]
    with torch.no_grad():
        feats = model.eval().extract_feat(data['input'])[0]
    torch.testing.assert_close(feats, data['features'], rtol=0, atol=1e-4 *
                               data['features'].abs().max().item())


def test_init_cfg_dense_norms_keep_their_init(official, tmp_path):
    """A dense backbone (out_indices 0-3) from a classifier file: norm0-2 are not
    in it and keep their LayerNorm initialisation; everything else is loaded."""
    src = str(tmp_path / 'official.pth')
    torch.save(official['state_dict'], src)
    model = MLLA(arch=SMALL, out_indices=(0, 1, 2, 3),
                 init_cfg=dict(type='Pretrained', checkpoint=src))
    model.init_weights()
    assert torch.equal(model.norm0.weight, torch.ones(12))
    assert torch.equal(model.norm3.weight, official['state_dict']['norm.weight'])
    assert torch.equal(model.layers[0].blocks[0].cpe1.weight,
                       official['state_dict']['layers.0.blocks.0.cpe1.weight'])


def test_init_cfg_fails_on_a_foreign_file(tmp_path):
    src = str(tmp_path / 'swin.pth')
    torch.save(swin_like(), src)
    model = MLLA(arch=SMALL, init_cfg=dict(type='Pretrained', checkpoint=src))
    with pytest.raises(ValueError, match='no MLLA tensors'):
        model.init_weights()


def test_an_official_release_with_its_yacs_config_loads(official, tool, tmp_path,
                                                        monkeypatch, capsys):
    """A release as the official training writes it: the weights next to the yacs
    ``CfgNode`` of its config. The converter and the backbone's init_cfg both read
    it (the config as plain data, no yacs code run) and give the same tensors."""
    src, dst = str(tmp_path / 'mlla_release.pth'), str(tmp_path / 'dst.pth')
    marker = str(tmp_path / 'ran')
    checkpoint_files.save_with_cfg_node(src, lambda CfgNode: dict(
        model=official['state_dict'], epoch=299, max_accuracy=83.4,
        config=CfgNode({'MODEL': CfgNode({'TYPE': 'mlla', 'DROP_PATH_RATE': 0.2})})),
        marker, monkeypatch)
    tool.main([src, dst])
    assert "converted 'model'" in capsys.readouterr().out
    converted = torch.load(dst, weights_only=True)['state_dict']
    model = classifier(init_cfg=dict(type='Pretrained', checkpoint=src))
    model.init_weights()
    for key, value in model.backbone.state_dict().items():
        if f'backbone.{key}' in converted:
            assert torch.equal(value, converted[f'backbone.{key}']), key
    assert torch.equal(model.backbone.norm3.weight, official['state_dict']['norm.weight'])
    assert not osp.exists(marker)


def test_a_file_that_runs_code_is_refused(official, tool, tmp_path, capsys):
    """An official-looking file with a ``__reduce__`` payload: refused by the
    converter and by init_cfg, naming the file and the global, and nothing runs."""
    from mmdinomamba.utils import UnsafeCheckpointError
    src, dst = str(tmp_path / 'evil.pth'), str(tmp_path / 'dst.pth')
    marker = str(tmp_path / 'ran')
    torch.save(dict(model=official['state_dict'], config=checkpoint_files.classic(marker)),
               src)
    assert_refused(tool, src, dst, capsys, [f'refusing to load {src}', 'posix.system'])
    model = MLLA(arch=SMALL, init_cfg=dict(type='Pretrained', checkpoint=src))
    with pytest.raises(UnsafeCheckpointError, match='posix.system'):
        model.init_weights()
    assert not osp.exists(marker) and not osp.exists(dst)
