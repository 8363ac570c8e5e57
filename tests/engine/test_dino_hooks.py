"""DINO schedules: hooks and the config's mmengine parameter schedulers."""
import os.path as osp
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS, PARAM_SCHEDULERS

from mmdinomamba.engine.hooks import (DINOFreezeLastLayerHook, DINOTeacherMomentumHook,
                                      DINOTeacherTempHook)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCHEDULE = osp.join(ROOT, 'configs/_base_/schedules/dino_adamw-coslr-100e.py')


@MODEL_WRAPPERS.register_module(force=True)
class _TestWrapper(nn.Module):
    """Stands in for DDP: the hooks must look through it via is_model_wrapper."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def official_cosine(base, final, total_iters, warmup_iters=0, warmup_start=0.0):
    """The schedule of the paper's code (utils.cosine_scheduler), rewritten."""
    warmup = np.linspace(warmup_start, base, warmup_iters) if warmup_iters else []
    iters = np.arange(total_iters - warmup_iters)
    rest = final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))
    return np.concatenate([warmup, rest])


def fake_runner(model, **kwargs):
    return SimpleNamespace(model=model, message_hub=MessageHub.get_instance('dino-hooks'),
                           **kwargs)


@pytest.mark.parametrize('wrap', [False, True])
def test_teacher_temp_hook_follows_linear_warmup(wrap):
    model = nn.Module()
    model.loss_module = SimpleNamespace(teacher_temp=None)
    hook = DINOTeacherTempHook(final_temp=0.07, warmup_temp=0.04, warmup_epochs=30)
    official = np.concatenate([np.linspace(0.04, 0.07, 30), np.full(70, 0.07)])
    runner = fake_runner(_TestWrapper(model) if wrap else model, epoch=0)
    for epoch in (0, 1, 15, 29, 30, 99):
        runner.epoch = epoch
        hook.before_train_epoch(runner)
        assert model.loss_module.teacher_temp == pytest.approx(official[epoch], abs=1e-12)
    hook.before_train_iter(runner, 0)
    assert runner.message_hub.get_scalar('train/teacher_temp').current() == \
        pytest.approx(0.07)


def test_teacher_temp_hook_constant_and_errors():
    hook = DINOTeacherTempHook()  # official Dino-Mamba: 0.04, no warm-up
    assert [hook.temp_at(e) for e in (0, 5)] == [0.04, 0.04]
    assert DINOTeacherTempHook(0.07, 0.04, warmup_epochs=1).temp_at(0) == 0.04
    with pytest.raises(ValueError, match='warmup_epochs'):
        DINOTeacherTempHook(warmup_epochs=-1)
    with pytest.raises(AttributeError, match='loss_module'):
        DINOTeacherTempHook().before_train_epoch(fake_runner(nn.Linear(1, 1), epoch=0))


@pytest.mark.parametrize('wrap', [False, True])
def test_teacher_momentum_hook_follows_cosine(wrap):
    model = nn.Module()
    model.teacher_momentum = 0.0
    total = 50
    official = official_cosine(0.996, 1.0, total)
    hook = DINOTeacherMomentumHook(0.996, 1.0)
    runner = fake_runner(_TestWrapper(model) if wrap else model, iter=0, max_iters=total)
    for it in (0, 1, 7, 25, 49):
        runner.iter = it
        hook.before_train_iter(runner, it)
        # iteration i completes the EMA step of optimizer step i - 1
        assert model.teacher_momentum == pytest.approx(official[max(it - 1, 0)], abs=1e-12)
    assert hook.momentum_at(total, total) == 1.0


def test_weight_decay_and_lr_follow_the_recipe():
    """The config's mmengine schedulers, stepped per iteration, against the recipe."""
    cfg = Config.fromfile(SCHEDULE)
    epochs, epoch_len = 100, 3
    total = epochs * epoch_len
    params = [nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(2))]
    base_lr = cfg.optim_wrapper.optimizer.lr
    optimizer = torch.optim.AdamW([dict(params=[params[0]], weight_decay=0.04),
                                   dict(params=[params[1]], weight_decay=0.0)],
                                  lr=base_lr)
    schedulers = []
    for sched_cfg in cfg.param_scheduler:
        sched_cfg = dict(sched_cfg)
        assert sched_cfg.pop('convert_to_iter_based')
        cls = PARAM_SCHEDULERS.get(sched_cfg.pop('type'))
        schedulers.append(cls.build_iter_from_epoch(optimizer, epoch_length=epoch_len,
                                                    **sched_cfg))
    wd_official = official_cosine(0.04, 0.4, total)
    lr_official = official_cosine(base_lr, 1e-6, total, warmup_iters=10 * epoch_len)
    seen = {}
    for it in range(total):
        seen[it] = (optimizer.param_groups[0]['lr'], optimizer.param_groups[0]['weight_decay'],
                    optimizer.param_groups[1]['weight_decay'])
        for s in schedulers:
            s.step()
    for it in (0, 1, 15, 29, 30, 31, 100, 200, 299):
        lr, wd, wd_flat = seen[it]
        # mmengine's cosine is recursive: ~1e-15 relative drift per step
        assert wd == pytest.approx(wd_official[it], rel=1e-9)
        assert wd_flat == 0.0
        # LinearLR starts at 1e-4 * lr instead of 0 (mmengine cannot start at 0), so
        # the warm-up differs from the paper's by at most 1e-4 * lr; after it, exact
        assert lr == pytest.approx(lr_official[it], rel=1e-9, abs=1e-4 * base_lr)
        if it >= 10 * epoch_len:
            assert lr == pytest.approx(lr_official[it], rel=1e-9)


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Linear(4, 4)
        self.last_layer = nn.Linear(4, 3)


@pytest.mark.parametrize('clip', [None, dict(max_norm=3.0)])
def test_freeze_last_layer_hook_keeps_last_layer_during_frozen_epochs(clip):
    torch.manual_seed(0)
    model = nn.Module()
    model.head = _Head()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.04)
    runner = fake_runner(_TestWrapper(model), epoch=0,
                         optim_wrapper=OptimWrapper(optimizer, clip_grad=clip))
    hook = DINOFreezeLastLayerHook(freeze_epochs=2)
    hook.before_train(runner)

    def step():
        loss = model.head.last_layer(model.head.mlp(torch.randn(5, 4))).square().sum()
        runner.optim_wrapper.update_params(loss)

    for epoch in (0, 1):
        runner.epoch = epoch
        last = [p.detach().clone() for p in model.head.last_layer.parameters()]
        mlp = model.head.mlp.weight.detach().clone()
        step()
        assert all(torch.equal(a, b) for a, b in
                   zip(last, model.head.last_layer.parameters()))
        assert not torch.equal(mlp, model.head.mlp.weight)
    runner.epoch = 2
    last = model.head.last_layer.weight.detach().clone()
    step()
    assert not torch.equal(last, model.head.last_layer.weight)
    hook.after_train(runner)
    runner.epoch = 0
    last = model.head.last_layer.weight.detach().clone()
    step()  # the optimizer pre-hook is gone after training
    assert not torch.equal(last, model.head.last_layer.weight)
