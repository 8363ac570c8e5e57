"""The fused stack of DinoVim blocks (``ops/triton/blocks.py``: one autograd node
for the whole stack) through Triton's interpreter: against the PyTorch twin
``blocks_loop`` in float64 and, bit for bit, against the per-block fused path it
replaces (the same kernels in the same order)."""
import pytest
import torch

import mmdinomamba.ops.triton.blocks as tb
from mmdinomamba.ops import blocks_loop
from mmdinomamba.ops.triton import add_rms_norm_triton, blocks_triton, mixer_core_triton
from tests.factories import dinovim
from .checks import assert_close_all, bits, rel


def per_block_fused(tokens, model, scales, normed_dtype, indices=None):
    """The path blocks_triton replaces: three autograd nodes per block; the last
    block's (h, residual), or with ``indices`` a list of those blocks' pairs."""
    h, residual, outs = tokens, None, []
    for i, layer in enumerate(model.layers):
        scale = scales[i] if scales is not None and residual is not None else None
        residual, normed = add_rms_norm_triton(h, residual, layer.norm.weight,
                                               layer.norm.eps, normed_dtype, scale)
        m = layer.mixer
        h = mixer_core_triton(m.in_proj(normed), m.core_params(), m.spec)
        outs.append((h, residual))
    return (h, residual) if indices is None else [outs[i] for i in indices]


def stack_args(model):
    return [layer.params() for layer in model.layers], [layer.spec() for layer in
                                                         model.layers]


CASES = {
    'bidir': dict(d_state=16, headdim=16),
    'bias': dict(d_state=16, headdim=16, bias=True, conv_bias=False),
    'causal': dict(d_state=16, headdim=16, bidirectional=False),
}


@pytest.fixture(params=sorted(CASES))
def case(request):
    """A 3-block DinoVim with every parameter away from its initial value, tokens,
    per-block and per-sample stochastic-depth factors, and output gradients."""
    model = dinovim(32, 3, img_size=32, patch_size=8, mixer_cfg=CASES[request.param])
    for p in model.parameters():
        p.data += 0.1 * torch.randn_like(p)
    tokens = torch.randn(3, 21, 32, requires_grad=True)
    scales = torch.tensor([[1., 1., 1.], [0., 1.25, 1.25], [2., 2., 0.]])
    return model.train(), tokens, scales, torch.randn(3, 21, 32), torch.randn(3, 21, 32)


def test_the_stack_is_its_twin_and_the_per_block_path(case):
    """Against blocks_loop in float64 (output and every gradient), and the same
    bits as the per-block fused path, with autograd and without."""
    model, tokens, scales, dh, dres = case
    params, specs = stack_args(model)
    weights = [tokens, *model.layers.parameters()]
    [got] = blocks_triton(tokens, params, specs, scales)
    g = torch.autograd.grad(got, weights, (dh, dres))
    model64 = model.double()
    [ref] = blocks_loop(tokens.double(), [l.params() for l in model64.layers], specs,
                        scales.double())
    g_ref = torch.autograd.grad(ref, [tokens, *model64.layers.parameters()],
                                (dh.double(), dres.double()))
    model.float()
    errors = {'h': rel(got[0], ref[0]), 'residual': rel(got[1], ref[1])}
    names = ['tokens'] + [n for n, _ in model.layers.named_parameters()]
    for name, a, b in zip(names, g, g_ref):
        errors['d' + name] = rel(a, b)
    assert {'d0.mixer.in_proj.weight', 'd2.norm.weight'} <= set(errors)
    assert_close_all(errors)
    want = per_block_fused(tokens, model, scales, torch.float32)
    g_want = torch.autograd.grad(want, weights, (dh, dres))
    assert bits((*got, *g), (*want, *g_want)) == 0.0
    with torch.no_grad():  # the forward alone, no autograd node
        [nograd] = blocks_triton(tokens, params, specs, scales)
    assert bits(nograd, got) == 0.0


def test_chosen_blocks_only(case):
    """The outputs of blocks 0 and 1 (block 2 does not run), gradients entering
    through block 0's h and block 1's residual only: the per-block path's bits,
    and no gradient for block 2."""
    model, tokens, scales, dh, dres = case
    params, specs = stack_args(model)
    weights = [tokens, *model.layers.parameters()]
    pairs = blocks_triton(tokens, params, specs, scales, indices=[0, 1])
    want = per_block_fused(tokens, model, scales, torch.float32, indices=[0, 1])
    loss = (pairs[0][0] * dh).sum() + (pairs[1][1] * dres).sum()
    loss_want = (want[0][0] * dh).sum() + (want[1][1] * dres).sum()
    g = torch.autograd.grad(loss, weights, allow_unused=True)
    g_want = torch.autograd.grad(loss_want, weights, allow_unused=True)
    assert bits([a for pair in pairs for a in pair],
                [b for pair in want for b in pair]) == 0.0
    assert bits([a for a, b in zip(g, g_want) if b is not None],
                [b for b in g_want if b is not None]) == 0.0
    assert all(a is None for a, (n, _) in zip(g[1:], model.layers.named_parameters())
               if n.startswith('2.'))


def half_model():
    return dinovim(32, 2, img_size=32, patch_size=8,
                   mixer_cfg=dict(d_state=16, headdim=16)).train()


def test_half_precision_compute():
    """A float16 compute dtype (autocast): the same bits as the per-block path,
    which then keeps the normalised rows in float16."""
    model = half_model()
    tokens = torch.randn(2, 21, 32, requires_grad=True)
    weights = [tokens, *model.layers.parameters()]
    dh, dres = torch.randn(2, 21, 32).half(), torch.randn(2, 21, 32)
    with torch.autocast('cpu', dtype=torch.float16):
        [got] = blocks_triton(tokens, *stack_args(model))
        want = per_block_fused(tokens, model, None, torch.float16)
    assert got[0].dtype == torch.float16
    g = torch.autograd.grad(got, weights, (dh, dres))
    g_want = torch.autograd.grad(want, weights, (dh, dres))
    assert bits((*got, *g), (*want, *g_want)) == 0.0


def test_a_frozen_stack_records_no_node(monkeypatch):
    """No parameter and no input needing a gradient, grad mode on (a linear
    probe's backbone): no autograd node, nothing kept for a backward."""
    model = half_model()
    tokens = torch.randn(2, 21, 32)
    with torch.no_grad():
        [want] = blocks_triton(tokens, *stack_args(model))
    for p in model.layers.parameters():
        p.requires_grad_(False)
    monkeypatch.setattr(tb._Blocks, 'apply', None)  # calling it would raise
    [got] = blocks_triton(tokens, *stack_args(model))
    assert bits(got, want) == 0.0
    assert not got[0].requires_grad


def test_a_second_backward_is_refused():
    model = half_model()
    tokens = torch.randn(2, 21, 32, requires_grad=True)
    [out] = blocks_triton(tokens, *stack_args(model))
    loss = out[0].sum() + out[1].sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match='already'):
        loss.backward()
