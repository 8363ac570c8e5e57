"""GroupedOptimWrapperConstructor: mmengine's per-tensor groups merged by setting,
with the same update as the unmerged groups."""
import logging

import torch
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor

from mmdinomamba.engine.optimizers import (GroupedOptimWrapperConstructor,
                                           merge_param_groups)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3),
                         nn.BatchNorm1d(3))


def build(constructor, model, fused):
    """``optim_wrapper=dict(constructor=..., optimizer=..., paramwise_cfg=...)``, as
    mmengine's build_optim_wrapper hands it to the constructor."""
    cfg = dict(optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.1, fused=fused))
    paramwise = dict(flat_decay_mult=0.0, custom_keys={'3.weight': dict(lr_mult=0.5)})
    return constructor(cfg, paramwise)(model)


def options_by_param(optimizer):
    return {id(p): {k: v for k, v in g.items() if k != 'params'}
            for g in optimizer.param_groups for p in g['params']}


def test_merge_keeps_first_appearance_order_and_parameter_order():
    a, b, c, d = (nn.Parameter(torch.zeros(1)) for _ in range(4))
    groups = [dict(params=[a], lr=1.0), dict(params=[b], lr=2.0, weight_decay=0.0),
              dict(params=[c], lr=1.0), dict(params=[d], lr=2.0)]
    merged = merge_param_groups(groups)
    assert [g['params'] for g in merged] == [[a, c], [b], [d]]
    assert [{k: v for k, v in g.items() if k != 'params'} for g in merged] == [
        dict(lr=1.0), dict(lr=2.0, weight_decay=0.0), dict(lr=2.0)]
    assert groups[0]['params'] == [a]  # the input is left as it was


def test_one_group_per_setting_and_the_same_updates():
    for fused in (False, True):
        models, wrappers = [], []
        for constructor in (DefaultOptimWrapperConstructor,
                            GroupedOptimWrapperConstructor):
            model = net()
            models.append(model)
            wrappers.append(build(constructor, model, fused))
        per_tensor, grouped = (w.optimizer for w in wrappers)
        n_params = len(list(models[0].parameters()))
        assert len(per_tensor.param_groups) == n_params
        # decayed (0.weight), flat without decay, the lr_mult weight
        assert len(grouped.param_groups) == 3
        # every tensor keeps its own options
        names = [n for n, _ in models[0].named_parameters()]
        opts = [options_by_param(o) for o in (per_tensor, grouped)]
        for n, p0, p1 in zip(names, models[0].parameters(), models[1].parameters()):
            assert opts[0][id(p0)] == opts[1][id(p1)], n
        # and AdamW moves each one exactly as with one group per tensor
        torch.manual_seed(1)
        for _ in range(3):
            x = torch.randn(6, 4)
            for model, optimizer in zip(models, (per_tensor, grouped)):
                optimizer.zero_grad()
                model(x).pow(2).sum().backward()
                optimizer.step()
        for n, p0, p1 in zip(names, models[0].parameters(), models[1].parameters()):
            assert torch.equal(p0, p1), (fused, n)
        assert not torch.equal(models[0][0].weight, net()[0].weight)  # it trained


def test_the_dino_recipe_trains_two_groups():
    """The shipped DINO schedule (here through its toy config), as the Runner builds
    it: two groups, decayed and not, holding every trained parameter."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    from mmdinomamba.registry import register_all_modules
    register_all_modules()
    cfg = Config.fromfile('configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py')
    init_default_scope(cfg.default_scope)
    assert cfg.optim_wrapper.constructor == 'GroupedOptimWrapperConstructor'
    model = MODELS.build(cfg.model)
    groups = build_optim_wrapper(model, cfg.optim_wrapper).optimizer.param_groups
    assert [g['weight_decay'] for g in groups] == [0.04, 0.0]
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    assert trained <= {id(p) for g in groups for p in g['params']}


def test_a_frozen_module_is_passed_over_without_a_warning_per_tensor():
    """DINO's teacher trains by EMA, not by the optimizer: the constructor leaves it
    out as a whole, with the same groups and no warning; mmengine's warns once per
    frozen tensor (what every DINO run printed, 78 lines for the toy model)."""
    from mmengine.logging import MMLogger

    logger = MMLogger.get_current_instance()
    groups, messages = {}, {}
    for constructor in (DefaultOptimWrapperConstructor, GroupedOptimWrapperConstructor):
        model = nn.ModuleDict(dict(student=net(), teacher=net()))
        model['teacher'].requires_grad_(False)
        seen = []
        handler = logging.Handler()
        handler.emit = lambda record, seen=seen: seen.append(record.getMessage())
        logger.addHandler(handler)
        try:
            optimizer = build(constructor, model, fused=False).optimizer
        finally:
            logger.removeHandler(handler)
        groups[constructor] = {id(p) for g in optimizer.param_groups for p in g['params']}
        messages[constructor] = [m for m in seen if 'requires_grad' in m]
        assert groups[constructor] == {id(p) for p in model['student'].parameters()}
    assert len(messages[DefaultOptimWrapperConstructor]) == \
        len(list(net().parameters()))
    assert messages[GroupedOptimWrapperConstructor] == []
