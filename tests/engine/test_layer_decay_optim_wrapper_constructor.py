"""LayerDecayOptimWrapperConstructor against an independent per-name computation.

The reference below works from names and module types only (the constructor asks
the backbone's ``get_layer_depth`` and looks at parameter shapes), so the two
agree only if both are right. Learning rates are compared with ``math.isclose``
at rel 1e-12: both sides multiply the same floats in a different order.
"""
import math
import re

import pytest
import torch.nn as nn

from mmdinomamba.engine import LayerDecayOptimWrapperConstructor
from mmdinomamba.ops import RMSNorm
from tests.factories import dinovim, linear_vit, mmpretrain_vit

BASE_LR = 1e-3
BASE_WD = 0.05
RATE = 0.7
NO_DECAY_LEAVES = {'pos_embed', 'cls_token', 'pos_embed_cls', 'A_log', 'D', 'A_log_b',
                   'D_b', 'dt_bias', 'dt_b_bias', 'bias'}
NORMS = (nn.LayerNorm, nn.BatchNorm2d, nn.GroupNorm, RMSNorm)


class Segmentor(nn.Module):
    """A backbone plus a head with a conv, a BatchNorm and a GroupNorm."""

    def __init__(self, backbone: nn.Module, dim: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Conv2d(dim, 8, 3), nn.BatchNorm2d(8),
                                  nn.GroupNorm(2, 8), nn.Conv2d(8, 3, 1, bias=False))


def tiny_dinovim(num_registers=0, frozen_stages=-1):
    return dinovim(32, 3, seed=None, num_registers=num_registers,
                   mixer_cfg=dict(d_state=16, headdim=16), frozen_stages=frozen_stages)


def tiny_linear_vit():
    return linear_vit(seed=None)


def tiny_mmpretrain_vit():
    return mmpretrain_vit(seed=None, img_size=64)


def reference_layer(name: str, depth: int) -> int:
    """BEiT's rule, written from names: embeddings 0, block k -> k + 1, rest last."""
    match = re.match(r'backbone\.layers\.(\d+)\.', name)
    if match:
        return int(match.group(1)) + 1
    if re.match(r'backbone\.(patch_embed|pos_embed|cls_token|pos_embed_cls)', name):
        return 0
    return depth + 1


def reference_no_decay(model: nn.Module):
    """Names of norm parameters (by module type) and of the listed leaves."""
    names = set()
    for module_name, module in model.named_modules():
        for leaf, _ in module.named_parameters(recurse=False):
            full = f'{module_name}.{leaf}' if module_name else leaf
            if isinstance(module, NORMS) or leaf in NO_DECAY_LEAVES:
                names.add(full)
    return names


def build_groups(model, paramwise_cfg=None, optimizer=None):
    optimizer = optimizer or dict(type='AdamW', lr=BASE_LR, weight_decay=BASE_WD)
    constructor = LayerDecayOptimWrapperConstructor(
        dict(optimizer=optimizer), paramwise_cfg or dict(layer_decay_rate=RATE))
    return constructor(model).optimizer.param_groups


@pytest.mark.parametrize('make_backbone', [
    lambda: tiny_dinovim(), lambda: tiny_dinovim(num_registers=2), tiny_linear_vit,
    tiny_mmpretrain_vit
], ids=['dinovim', 'dinovim-reg', 'linear-vit', 'mmpretrain-vit'])
def test_groups_match_reference(make_backbone):
    backbone = make_backbone()
    depth = backbone.num_layers
    model = Segmentor(backbone, backbone.embed_dims)
    groups = build_groups(model)
    no_decay = reference_no_decay(model)
    params = dict(model.named_parameters())

    seen = []
    for group in groups:
        for name, param in zip(group['param_names'], group['params']):
            assert param is params[name]
            seen.append(name)
            expected_lr = BASE_LR * RATE**(depth + 1 - reference_layer(name, depth))
            assert math.isclose(group['lr'], expected_lr, rel_tol=1e-12), name
            expected_wd = 0.0 if name in no_decay else BASE_WD
            assert group['weight_decay'] == expected_wd, name
    assert sorted(seen) == sorted(params)
    # the scales really span the network: embeddings and head differ
    lrs = {group['lr'] for group in groups}
    assert math.isclose(min(lrs), BASE_LR * RATE**(depth + 1), rel_tol=1e-12)
    assert math.isclose(max(lrs), BASE_LR, rel_tol=1e-12)


def test_listed_names_have_no_decay():
    """The issue's list, spelled out on DinoMamba-Reg (A_log_b etc. exist)."""
    model = Segmentor(tiny_dinovim(num_registers=2), 32)
    wd = {name: group['weight_decay'] for group in build_groups(model)
          for name in group['param_names']}
    for name in ['backbone.pos_embed', 'backbone.cls_token', 'backbone.pos_embed_cls',
                 'backbone.norm_f.weight', 'backbone.layers.1.norm.weight',
                 'backbone.layers.1.mixer.norm_b.weight',
                 'backbone.layers.0.mixer.A_log',
                 'backbone.layers.0.mixer.A_log_b', 'backbone.layers.0.mixer.D',
                 'backbone.layers.0.mixer.D_b', 'backbone.layers.2.mixer.dt_bias',
                 'backbone.layers.2.mixer.dt_b_bias', 'backbone.patch_embed.proj.bias',
                 'head.0.bias', 'head.1.weight', 'head.2.weight']:
        assert wd[name] == 0.0, name
    for name in ['backbone.patch_embed.proj.weight',
                 'backbone.layers.0.mixer.in_proj.weight',
                 'backbone.layers.0.mixer.conv1d.weight', 'head.0.weight',
                 'head.3.weight']:
        assert wd[name] == BASE_WD, name


def test_frozen_parameters_are_left_out():
    model = Segmentor(tiny_dinovim(frozen_stages=1), 32)
    names = {name for group in build_groups(model) for name in group['param_names']}
    assert 'backbone.layers.0.mixer.in_proj.weight' not in names
    assert 'backbone.pos_embed' not in names
    assert 'backbone.layers.1.mixer.in_proj.weight' in names


def test_optimizer_default_weight_decay_is_kept():
    """Without weight_decay in the config, decayed groups use the optimizer default."""
    model = Segmentor(tiny_linear_vit(), 32)
    groups = build_groups(model, optimizer=dict(type='AdamW', lr=BASE_LR))
    by_name = {name: group['weight_decay'] for group in groups
               for name in group['param_names']}
    assert by_name['backbone.layers.0.mlp.fc1.weight'] == 0.01  # torch AdamW default
    assert by_name['backbone.layers.0.mlp.fc1.bias'] == 0.0


@pytest.mark.parametrize('paramwise_cfg, match', [
    (dict(), 'layer_decay_rate'),
    (dict(layer_decay_rate=1.5), 'layer_decay_rate'),
    (dict(layer_decay_rate=0.65, num_layers=12), 'unknown paramwise_cfg keys'),
    (dict(layer_decay_rate=0.65, reference_num_layers=0), 'reference_num_layers'),
    (dict(layer_decay_rate=0.65, reference_num_layers=12.0), 'reference_num_layers'),
])
def test_bad_paramwise_cfg(paramwise_cfg, match):
    with pytest.raises(ValueError, match=match):
        LayerDecayOptimWrapperConstructor(
            dict(optimizer=dict(type='AdamW', lr=BASE_LR)), paramwise_cfg)


def test_model_without_layer_depth():
    model = Segmentor(nn.Conv2d(3, 32, 3), 32)
    with pytest.raises(ValueError, match='get_layer_depth'):
        build_groups(model)


@pytest.mark.parametrize('depth', [2, 3, 6])
def test_rate_is_normalised_by_depth(depth):
    """With reference_num_layers=R a backbone of n blocks decays by
    rate ** (R / n) per layer: closed form per parameter, and the lr ratio from
    the last block to the embeddings is rate ** R at every depth."""
    reference = 4
    backbone = dinovim(32, depth, seed=None, mixer_cfg=dict(d_state=16, headdim=16))
    groups = build_groups(Segmentor(backbone, 32),
                          dict(layer_decay_rate=RATE, reference_num_layers=reference))
    per_layer = RATE ** (reference / depth)
    lr_of = {}
    for group in groups:
        for name in group['param_names']:
            expected = BASE_LR * per_layer ** (depth + 1 - reference_layer(name, depth))
            assert math.isclose(group['lr'], expected, rel_tol=1e-12), name
            lr_of[name] = group['lr']
    last_block = lr_of[f'backbone.layers.{depth - 1}.mixer.in_proj.weight']
    assert math.isclose(lr_of['backbone.pos_embed'] / last_block, RATE ** reference,
                        rel_tol=1e-12)


def test_first_group_has_the_base_lr():
    """mmengine logs the first group's lr as `lr`: that must be the base lr (the
    head's), not the embeddings' (the smallest)."""
    from mmengine.hooks import RuntimeInfoHook
    from mmengine.logging import MessageHub

    model = Segmentor(tiny_dinovim(), 32)
    constructor = LayerDecayOptimWrapperConstructor(
        dict(optimizer=dict(type='AdamW', lr=BASE_LR)), dict(layer_decay_rate=RATE))
    wrapper = constructor(model)
    scales = [g['lr_scale'] for g in wrapper.optimizer.param_groups]
    assert scales == sorted(scales, reverse=True) and scales[0] == 1.0

    class FakeRunner:
        optim_wrapper = wrapper
        message_hub = MessageHub.get_instance('layer-decay-lr-log')
        iter = 0

    RuntimeInfoHook().before_train_iter(FakeRunner(), 0)
    assert FakeRunner.message_hub.get_scalar('train/lr').current() == BASE_LR
