"""Per-parameter gradient clipping (DINO's rule) and its optimizer wrappers."""
import argparse

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config

from mmdinomamba.engine.optimizers import (PerParamClipOptimWrapper,
                                           clip_grad_norm_per_param_)


def dino_rule(grads, max_norm):
    """The rule as a plain loop over tensors, in float64."""
    out = []
    for g in grads:
        g = g.double()
        coef = max_norm / (float(g.norm()) + 1e-6)
        out.append(g * coef if coef < 1 else g.clone())
    return out


def make_params(scales):
    torch.manual_seed(0)
    params = []
    for i, s in enumerate(scales):
        p = nn.Parameter(torch.randn(3 + i, 2))
        p.grad = torch.randn_like(p) * s
        params.append(p)
    return params


def test_clips_each_tensor_on_its_own():
    params = make_params([0.01, 1.0, 10.0, 100.0])
    before = [p.grad.clone() for p in params]
    expected = dino_rule(before, 3.0)
    total = clip_grad_norm_per_param_(params, 3.0)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad.double(), e, rtol=1e-6, atol=0)
    # small gradients are untouched, big ones end at norm 3 (minus the eps)
    assert torch.equal(params[0].grad, before[0])
    for p in params[2:]:
        assert abs(float(p.grad.norm()) - 3.0) < 1e-5
    # what is logged: the norm of all gradients together, before clipping
    all_grads = torch.cat([g.flatten() for g in before])
    assert float(total) == pytest.approx(float(all_grads.norm()), rel=1e-6)


def test_differs_from_global_clipping():
    params = make_params([1.0, 10.0])
    clip_grad_norm_per_param_(params, 3.0)
    small = params[0].grad.clone()
    params = make_params([1.0, 10.0])
    torch.nn.utils.clip_grad_norm_(params, 3.0)
    assert not torch.allclose(small, params[0].grad)  # global clipping shrinks it too


def test_skips_missing_grads_and_rejects_bad_norm():
    p = nn.Parameter(torch.ones(2))
    assert float(clip_grad_norm_per_param_([p], 1.0)) == 0.0
    with pytest.raises(ValueError, match='max_norm'):
        clip_grad_norm_per_param_([p], 0.0)


def test_wrapper_step_uses_the_rule():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    wrapper = PerParamClipOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        clip_grad=dict(max_norm=0.5))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = (model(torch.randn(8, 4)) * 100).pow(2).mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    clipped = dict(zip(grads, dino_rule(list(grads.values()), 0.5)))
    wrapper.step()
    for n, p in model.named_parameters():  # SGD, lr 1: p = p0 - clipped grad
        torch.testing.assert_close(p.detach().double(),
                                   before[n].double() - clipped[n], rtol=1e-6, atol=1e-7)


def test_wrapper_rejects_other_clip_arguments():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match='max_norm'):
        PerParamClipOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=1.),
                                 clip_grad=dict(type='value', clip_value=1.0))


def test_train_amp_flag_keeps_per_param_clipping(load_tool):
    train = load_tool('tools/train.py')
    args = argparse.Namespace(config='x.py', launcher='none', cfg_options=None,
                              work_dir='/tmp/w',
                              amp=True, amp_dtype=None, resume=None,
                              no_validate=False, auto_scale_lr=False)
    for wrapper, amp_twin in (('PerParamClipOptimWrapper', 'PerParamClipAmpOptimWrapper'),
                              ('OptimWrapper', 'AmpOptimWrapper'),
                              ('PerParamClipAmpOptimWrapper',
                               'PerParamClipAmpOptimWrapper')):
        cfg = Config(dict(optim_wrapper=dict(type=wrapper)))
        assert train.merge_args(cfg, args).optim_wrapper.type == amp_twin


def test_multi_tensor_clipping_equals_the_per_tensor_loop():
    """The multi-tensor implementation against the loop it replaced (one float32
    norm and one in-place scale per tensor), on float32 gradients."""
    params = make_params([0.01, 1.0, 10.0, 100.0, 3.0])
    grads = [p.grad.clone() for p in params]
    norms = torch.stack([g.float().norm(2) for g in grads])
    for g, scale in zip(grads, (3.0 / (norms + 1e-6)).clamp(max=1.0)):
        g.mul_(scale)
    total = clip_grad_norm_per_param_(params, 3.0)
    for p, g in zip(params, grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=0)
    torch.testing.assert_close(total, norms.norm(2), rtol=1e-6, atol=0)
