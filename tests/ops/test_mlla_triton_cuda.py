"""MLLA's fused kernels (mmdinomamba.ops.triton.mlla) on a CUDA device, against
their PyTorch twins: each kernel alone, the mixer (fused path against
``attn_backend='ref'``, the mixing matrix) and the backbone, forward and
gradients, in float32 (TF32 off: IEEE rounding, far below 1e-4) and under bf16
autocast (the projections round to bf16, 2^-9 each: 2e-2 catches any wrong term).
"""
import copy

import pytest
import torch

from mmdinomamba.models import MLLA
from mmdinomamba.models.mixers import LinearAttentionMixer
from mmdinomamba.models.mixers.positional import rope_2d_table
from mmdinomamba.ops.mlla import (mlla_features, mlla_features_auto, mlla_output,
                                  mlla_output_ref, rope_head_table)
from tests.factories import mlla_arch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures('no_tf32')]

FP32_TOL = 1e-4
BF16_TOL = 2e-2


def rel(a, b):
    """Relative distance; two tensors that are both exactly zero (a parameter a
    configuration leaves without gradient) are at distance 0."""
    a, b = a.double(), b.double()
    if not b.any():
        return a.norm().item()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_feature_kernel_is_its_twin(dtype):
    torch.manual_seed(0)
    hw, heads, width = (14, 14), 4, 128
    qk = torch.randn(8, 196, 2 * width, device='cuda').to(dtype).requires_grad_(True)
    table = rope_head_table(*rope_2d_table(hw, width, device='cuda'), heads)
    fast = mlla_features_auto(qk, heads, table)
    slow = mlla_features(qk, heads, table)
    w = [torch.randn_like(t) for t in slow]
    g_fast, = torch.autograd.grad(sum((t * x).sum() for t, x in zip(fast, w)), qk)
    g_slow, = torch.autograd.grad(sum((t * x).sum() for t, x in zip(slow, w)), qk)
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    assert rel(fast[0], slow[0]) < FP32_TOL and rel(fast[1], slow[1]) < FP32_TOL
    assert rel(g_fast, g_slow) < tol


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_output_kernel_is_its_twin(dtype):
    torch.manual_seed(0)
    num = torch.randn(8, 4, 196, 32, device='cuda', requires_grad=True)
    den = (torch.rand(8, 4, 196, 1, device='cuda') + 0.5).requires_grad_(True)
    extra = torch.randn(8, 196, 128, device='cuda').to(dtype).requires_grad_(True)
    fast = mlla_output(num, den, extra, 196e-6, dtype)
    slow = mlla_output_ref(num, den, extra, 196e-6, dtype)
    w = torch.randn_like(slow)
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    assert rel(fast, slow) < tol
    for a, b in zip(torch.autograd.grad((fast * w).sum(), [num, den, extra]),
                    torch.autograd.grad((slow * w).sum(), [num, den, extra])):
        assert rel(a, b) < tol


CFGS = [dict(rope=True, lepe=True), dict(), dict(rope=True, lepe=True, shortcut=True,
                                                 input_gate=True),
        dict(rope=True, forget_gate='head'), dict(forget_gate='channel', lepe=True)]


@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'bf16-autocast'])
@pytest.mark.parametrize('cfg', CFGS, ids=lambda c: '+'.join(map(str, c)) or 'plain')
def test_mixer_fused_path_is_the_ref_backend(cfg, amp):
    torch.manual_seed(0)
    mixer = LinearAttentionMixer(64, 4, **cfg).cuda()
    twin = LinearAttentionMixer(64, 4, attn_backend='ref', **cfg).cuda()
    twin.load_state_dict(mixer.state_dict())
    u = torch.randn(4, 99, 64, device='cuda', requires_grad=True)
    with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp):
        fast, slow = mixer(u, (9, 11)), twin(u, (9, 11))
    tol = BF16_TOL if amp else FP32_TOL
    assert fast.dtype == slow.dtype and rel(fast, slow) < tol
    w = torch.randn_like(fast)
    for a, b in zip(torch.autograd.grad((fast * w).sum(), [u, *mixer.parameters()]),
                    torch.autograd.grad((slow * w).sum(), [u, *twin.parameters()])):
        assert rel(a, b) < tol


def test_mlla_fused_path_is_the_ref_backend():
    """The whole backbone, eval mode, float32: the fused path may round differently
    from the ref path, not compute something else. The network amplifies float32
    rounding (its gradients move by ~1e-3 between two float32 paths), so both are
    measured against the ref path in float64, and the fused path's distance may be at
    most a few times the float32 ref path's own."""
    torch.manual_seed(0)
    arch = mlla_arch(embed_dims=32, depths=[1, 2, 2, 1], num_heads=[2, 4, 8, 16])
    fast = MLLA(arch=arch, drop_path_rate=0.0).cuda().eval()
    slow = MLLA(arch=arch, drop_path_rate=0.0,
                mixer_cfg=dict(attn_backend='ref')).cuda().eval()
    slow.load_state_dict(fast.state_dict())
    exact = copy.deepcopy(slow).double()
    x = torch.randn(2, 3, 96, 128, device='cuda')
    outs, grads = [], []
    for model, inp in ((fast, x), (slow, x), (exact, x.double())):
        out = model(inp)[0]
        grads.append(torch.cat([g.flatten().double() for g in torch.autograd.grad(
            out.square().sum(), list(model.parameters()))]))
        outs.append(out.double())
    assert rel(outs[0], outs[2]) <= 4 * rel(outs[1], outs[2]) + 1e-7
    assert rel(grads[0], grads[2]) <= 4 * rel(grads[1], grads[2]) + 1e-7
