"""tools/model_converters/extract_teacher.py and the package function it wraps,
on a key dump of a DINO checkpoint."""
import pytest
import torch

from mmdinomamba.models.checkpoint import dino_backbone_state


@pytest.fixture(scope='module')
def extract_teacher(load_tool):
    return load_tool('tools/model_converters/extract_teacher.py')


# the key layout of a DINO checkpoint's state_dict (values tell the branches apart)
DUMP = {
    'backbone.pos_embed': torch.full((1, 2), 1.0),
    'backbone.layers.0.norm.weight': torch.full((2, ), 2.0),
    'head.last_layer.parametrizations.weight.original1': torch.zeros(3, 2),
    'teacher.backbone.pos_embed': torch.full((1, 2), 3.0),
    'teacher.backbone.layers.0.norm.weight': torch.full((2, ), 4.0),
    'teacher.head.mlp.0.weight': torch.zeros(2, 2),
    'loss_module.center': torch.zeros(1, 3),
}


@pytest.mark.parametrize('branch,values', [('teacher', (3.0, 4.0)), ('student', (1.0, 2.0))])
def test_convert_keeps_one_backbone(branch, values):
    out = dino_backbone_state(DUMP, branch)
    assert list(out) == ['pos_embed', 'layers.0.norm.weight']
    assert [float(v.flatten()[0]) for v in out.values()] == list(values)


def test_convert_rejects_other_checkpoints():
    with pytest.raises(ValueError, match='teacher.backbone'):
        dino_backbone_state({'backbone.x': torch.zeros(1)})
    with pytest.raises(ValueError, match='branch'):
        dino_backbone_state(DUMP, 'ema')


def test_cli_writes_a_loadable_backbone_checkpoint(tmp_path, capsys,
                                                    extract_teacher):
    src, out = str(tmp_path / 'dino.pth'), str(tmp_path / 'sub' / 'teacher.pth')
    torch.save(dict(state_dict=DUMP, meta=dict(epoch=7, iter=70)), src)
    extract_teacher.main([src, out, '--student'])
    saved = torch.load(out, weights_only=True)
    assert saved['meta']['branch'] == 'student' and saved['meta']['epoch'] == 7
    assert torch.equal(saved['state_dict']['pos_embed'], DUMP['backbone.pos_embed'])
    assert 'student backbone: 2 tensors' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        extract_teacher.main([str(tmp_path / 'missing.pth'), out])
