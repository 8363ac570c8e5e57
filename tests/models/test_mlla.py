"""MLLA: the official fixture through the converter, parameter counts, any input
size, mixed precision, outputs, freezing and layer-wise lr decay."""
import warnings

import pytest
import torch

from mmdinomamba.models import MLLA
from mmdinomamba.models.backbones.mlla_official import convert
from tests.factories import MLLA_SMALL, mlla_arch
from tests.helpers.reference_data import MLLA as MLLA_REFERENCE
from tests.helpers.reference_data import load_reference

SMALL = MLLA_SMALL  # the official fixture's
TINY = mlla_arch(mlp_ratio=4.0)


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.fixture(scope='module')
def official():
    return load_reference(MLLA_REFERENCE)


def classifier(num_classes=10, arch=None, **backbone):
    from mmpretrain.registry import MODELS
    import mmdinomamba  # noqa: F401
    arch = arch or SMALL
    return MODELS.build(dict(
        type='ImageClassifier',
        backbone=dict(type='MLLA', arch=arch, drop_path_rate=0.0, **backbone),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=num_classes,
                  in_channels=arch['embed_dims'] * 8)))


def is_block(name):
    """``layers.{i}.blocks.{j}`` (not a module inside a block)."""
    return name.split('.')[2:3] == ['blocks'] and name.count('.') == 3


def run_with_hooks(model, x):
    """Logits, pooled features, and every block's / attention module's output and
    the attention inputs, keyed by the official module names."""
    captured = {}
    hooks = []
    for name, module in model.backbone.named_modules():
        if name.endswith(('.attn', '.downsample')) or is_block(name):
            hooks.append(module.register_forward_hook(
                lambda m, args, out, name=name: captured.__setitem__(name, (args, out))))
    try:
        with torch.no_grad():
            feats = model.extract_feat(x)[0]
            logits = model.head.fc(feats)
    finally:
        for hook in hooks:
            hook.remove()
    return logits, feats, captured


@pytest.mark.parametrize('case', [0, 1], ids=['64px', '96px'])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_reproduces_the_official_model(official, case, dtype):
    """Official state dict -> convert -> ImageClassifier: logits, features, every
    stage's, block's and attention module's output (official float64 where the
    fixture has it). Tolerances: 1e-5 relative in float64 (measured ~1e-9; the
    official RoPE runs in float32, which leaves ~4e-7 on block outputs), 1e-4 in
    float32 (measured ~4e-7)."""
    data = official['cases'][case]
    model = classifier()
    model.load_state_dict(convert(official['state_dict']))  # strict: every key
    model = model.to(dtype).eval()
    logits, feats, cap = run_with_hooks(model, data['input'].to(dtype))
    fp64 = dtype == torch.float64
    tol = 1e-5 if fp64 else 1e-4
    suffix = '_fp64' if fp64 else ''
    assert rel_err(logits, data['output' + suffix]) < tol
    assert rel_err(feats, data['features' + suffix]) < tol
    for i, depth in enumerate(official['config']['depths']):
        last = f'layers.{i}.blocks.{depth - 1}'
        assert rel_err(cap[last][1], data['stage_outputs' + suffix][i]) < tol, i
        after = cap[f'layers.{i}.downsample'][1][0] if i < 3 else cap[last][1]
        assert rel_err(after, data['layer_outputs'][i]) < 1e-4, i
    assert sorted(data['block_outputs']) == sorted(k for k in cap if is_block(k))
    for name in data['block_outputs']:
        assert rel_err(cap[name][1], data['block_outputs'][name]) < 1e-4, name
        assert rel_err(cap[name + '.attn'][0][0], data['attn_inputs'][name]) < 1e-4
        assert rel_err(cap[name + '.attn'][1], data['attn_outputs'][name]) < 1e-4
    # the backbone's last output is the final-normed stage whose mean is the feature
    out = model.backbone(data['input'].to(dtype))
    assert len(out) == 1 and out[0].shape[1:] == (96, data['img_size'] // 32,
                                                  data['img_size'] // 32)


def test_a_swapped_tensor_is_caught(official):
    """q and k halves of one block's attn.qk exchanged: the fixture notes the logits
    move by only ~1e-4, the attention output by ~18 %."""
    state = convert(official['state_dict'])
    key = 'backbone.layers.2.blocks.1.attn.qk.weight'
    state[key] = state[key].roll(state[key].shape[0] // 2, dims=0)
    model = classifier()
    model.load_state_dict(state)
    data = official['cases'][0]
    _, _, cap = run_with_hooks(model.eval(), data['input'])
    name = 'layers.2.blocks.1'
    assert rel_err(cap[name + '.attn'][1], data['attn_outputs'][name]) > 1e-2


@pytest.mark.parametrize('arch,count', [('tiny', 24_392_200), ('small', 43_015_048),
                                        ('base', 95_983_960)])
def test_parameter_counts(arch, count):
    """The official class's counts with a 1000-class head (docs/mlla.md)."""
    from mmpretrain.registry import MODELS
    import mmdinomamba  # noqa: F401
    model = MODELS.build(dict(
        type='ImageClassifier', backbone=dict(type='MLLA', arch=arch),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=1000,
                  in_channels=MLLA.arch_zoo[arch]['embed_dims'] * 8)))
    assert sum(p.numel() for p in model.parameters()) == count


def test_any_input_size_rectangular_and_odd():
    """No resolution-bound buffer: 96 x 160 and odd sizes run; odd sides are padded
    at the bottom and right as the official dense backbones do (ceil division)."""
    torch.manual_seed(0)
    model = MLLA(arch=TINY, out_indices=(0, 1, 2, 3)).eval()
    assert not [name for name, _ in model.named_buffers() if 'rotation' in name]
    with torch.no_grad():
        rect = model(torch.randn(2, 3, 96, 160))
        odd = model(torch.randn(1, 3, 61, 83))
    assert [tuple(t.shape) for t in rect] == [(2, 16, 24, 40), (2, 32, 12, 20),
                                              (2, 64, 6, 10), (2, 128, 3, 5)]
    assert [tuple(t.shape[-2:]) for t in odd] == [(16, 21), (8, 11), (4, 6), (2, 3)]
    # padding the input by hand to a multiple of 4 gives the same result
    x = torch.randn(1, 3, 61, 83)
    padded = torch.nn.functional.pad(x, (0, 1, 0, 3))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], model(padded)[0])


def test_bfloat16_autocast_without_warnings():
    """CPU autocast: no complex-half warning, no dtype error, bf16 accuracy."""
    torch.manual_seed(0)
    model = MLLA(arch=TINY, out_indices=(0, 1, 2, 3)).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        ref = model(x)
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            with torch.autocast('cpu', dtype=torch.bfloat16):
                out = model(x)
    for r, o in zip(ref, out):
        assert o.dtype == torch.bfloat16
        # bf16 keeps 8 bits of mantissa (eps 2^-8 = 0.4 %); a few roundings deep
        assert rel_err(o, r) < 0.05


def test_float16_module_runs():
    """The whole model in float16 (issue #24 upstream: mixed dtypes in kv)."""
    torch.manual_seed(0)
    model = MLLA(arch=TINY).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)[0]
        half = model.half()(x.half())[0]
    assert half.dtype == torch.float16
    assert rel_err(half, ref) < 0.05


def test_arch_presets_and_errors():
    assert MLLA.arch_zoo['t'] == MLLA.arch_zoo['tiny']
    assert MLLA(arch='b').dims == [96, 192, 384, 768]
    with pytest.raises(ValueError, match='unknown arch'):
        MLLA(arch='huge')
    with pytest.raises(ValueError, match=r"missing \['mlp_ratio'\]"):
        MLLA(arch=dict(embed_dims=16, depths=[1] * 4, num_heads=[1] * 4))
    with pytest.raises(ValueError, match='4 stages'):
        MLLA(arch=mlla_arch(TINY, depths=[1, 1, 1]))
    with pytest.raises(ValueError, match='out of range'):
        MLLA(arch=TINY, out_indices=(4, ))
    with pytest.raises(ValueError, match=r'input must have shape \(batch, 3'):
        MLLA(arch=TINY)(torch.randn(3, 64, 64))


def test_out_indices_give_normed_maps():
    torch.manual_seed(0)
    model = MLLA(arch=TINY, out_indices=(-1, 1)).eval()
    assert model.out_indices == [1, 3]
    assert hasattr(model, 'norm1') and hasattr(model, 'norm3')
    assert not hasattr(model, 'norm0')
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        outs = model(x)
        inter = model.forward_intermediates(x, [1, 3])
    stage1 = inter.features[1]  # the last block of stage 1
    expected = model.norm1(stage1).transpose(1, 2).reshape(1, 32, 8, 8)
    torch.testing.assert_close(outs[0], expected)


def test_frozen_stages():
    model = MLLA(arch=TINY, out_indices=(0, 1, 2, 3), frozen_stages=2)
    model.train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.named_parameters()
                      if n.startswith(('patch_embed', 'layers.0.', 'layers.1.',
                                       'norm0', 'norm1'))}
    assert not model.layers[1].training and model.layers[2].training
    assert not model.patch_embed.conv1.norm.training


def test_get_layer_depth():
    model = MLLA(arch=mlla_arch(TINY, depths=[2, 1, 3, 1]))
    total = 2 + 1 + 3 + 1 + 2
    assert model.get_layer_depth('backbone.patch_embed.conv1.conv.weight',
                                 'backbone.') == (0, total)
    assert model.get_layer_depth('backbone.layers.0.blocks.1.attn.qk.weight',
                                 'backbone.') == (2, total)
    assert model.get_layer_depth('backbone.layers.2.blocks.0.norm1.weight',
                                 'backbone.') == (4, total)
    assert model.get_layer_depth('backbone.layers.2.downsample.conv.0.conv.weight',
                                 'backbone.') == (6, total)
    assert model.get_layer_depth('backbone.norm3.weight', 'backbone.') == (8, total)
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (8, total)
    depths = {model.get_layer_depth(n)[0] for n, _ in model.named_parameters()}
    assert depths == set(range(total))


def test_forward_intermediates_layouts_per_stage():
    torch.manual_seed(0)
    model = MLLA(arch=mlla_arch(TINY, depths=[1, 2, 1, 1])).eval()
    assert model.num_layers == 5
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        out = model.forward_intermediates(x, [0, 2, -1], mixer_inputs=True)
    assert sorted(out.features) == [0, 2, 4]
    assert out.layout_of(0).hw == (16, 24) and out.layout_of(2).hw == (8, 12)
    assert out.layout_of(4).hw == (2, 3) and out.layout.hw == (2, 3)
    assert out.layout_of(2).readout_type == 'mean'
    assert out.mixer_inputs[2].shape == (1, 96, 32)
    assert model.token_mixer(2) is model.layers[1].blocks[1].attn


def test_layer_wise_lr_decay_in_mmpretrain():
    """mmpretrain's constructor asks the classifier, which asks the backbone: one lr
    per layer id, the stem lowest, the head highest."""
    from mmpretrain.engine.optimizers import LearningRateDecayOptimWrapperConstructor
    model = classifier(arch=mlla_arch(TINY, depths=[1, 1, 2, 1]), num_classes=3)
    constructor = LearningRateDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0,
                                                 weight_decay=0.05)),
        dict(layer_decay_rate=0.5))
    groups = constructor(model).optimizer.param_groups
    lr = {g['param_name']: g['lr'] for g in groups}  # one group per tensor
    assert len(set(lr.values())) == 5 + 2
    assert lr['backbone.patch_embed.conv1.conv.weight'] == 0.5 ** 6
    assert lr['backbone.layers.2.blocks.1.attn.qk.weight'] == 0.5 ** 2
    assert lr['backbone.layers.2.downsample.conv.0.conv.weight'] == 0.5 ** 2
    assert lr['head.fc.weight'] == lr['backbone.norm3.weight'] == 1.0
