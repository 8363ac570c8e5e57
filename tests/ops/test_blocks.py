"""A stack of DinoVim blocks in one call (ops/blocks.py, ops/triton/blocks.py).

The PyTorch twin ``blocks_loop`` is checked against the blocks' own modules called
one after the other; the fused stack (one autograd node) against the twin in float64
and, bit for bit, against the per-block fused path it replaces (the same kernels in
the same order), on the CPU through Triton's interpreter, in
``tests/ops/interpret/test_blocks.py``.
"""
import copy

import pytest
import torch

from mmdinomamba.models.backbones import DinoVim
from mmdinomamba.ops import blocks_loop, run_blocks, uses_fused_blocks
from tests.factories import dinovim


def tiny(**kw):
    kw = dict(dict(drop_path_rate=0.5, mixer_cfg=dict(d_state=16, headdim=16)), **kw)
    return dinovim(32, 3, img_size=32, patch_size=8, **kw)


def _stack_args(model):
    return ([layer.params() for layer in model.layers],
            [layer.spec() for layer in model.layers])


def test_ref_is_the_blocks_one_after_the_other():
    """blocks_loop with drawn factors equals the MambaBlock modules given the same
    factors, forward and gradients, to the bit (the same ops)."""
    model = tiny().train()
    tokens = torch.randn(4, 18, 32, requires_grad=True)
    scales = torch.tensor([[1., 1., 1., 1.], [0., 2., 2., 0.], [2., 0., 2., 2.]])
    params, specs = _stack_args(model)
    [(h, residual)] = blocks_loop(tokens, params, specs, scales)
    want_h, want_res = tokens, None
    for i, layer in enumerate(model.layers):
        want_h, want_res = layer(want_h, want_res, scales[i])
    assert torch.equal(h, want_h) and torch.equal(residual, want_res)
    weights = [tokens, *model.layers.parameters()]
    g = torch.autograd.grad((h.sum() + residual.square().sum()), weights)
    g_want = torch.autograd.grad((want_h.sum() + want_res.square().sum()), weights)
    for a, b in zip(g, g_want):
        assert torch.equal(a, b)
    assert not uses_fused_blocks(tokens, specs)  # a CPU tensor: run_blocks() runs the twin
    [got] = run_blocks(tokens, params, specs, scales)
    assert all(torch.equal(a, b) for a, b in zip(got, (h, residual)))
    # indices: the outputs of those blocks, none run after the last of them
    pairs = blocks_loop(tokens, params, specs, scales, indices=[1, 0, 1])
    want_h, want_res, want = tokens, None, []
    for i, layer in enumerate(model.layers[:2]):
        want_h, want_res = layer(want_h, want_res, scales[i])
        want.append((want_h, want_res))
    assert len(pairs) == 2 and all(torch.equal(a, b) for pair, w in zip(pairs, want)
                                   for a, b in zip(pair, w))
    for bad in ([], [3], [-1]):
        with pytest.raises(ValueError, match='indices must be block numbers'):
            blocks_loop(tokens, params, specs, scales, indices=bad)


def test_dinovim_draws_one_factor_per_block_and_sample():
    """Training draws a (blocks, batch) tensor of 0 and 1 / keep (keep = 1 - the
    block's rate; the first blocks, of rate 0, are all 1); eval draws none; the
    forward is the stack run with that draw."""
    model = tiny().train()
    tokens = torch.randn(64, 18, 32)
    torch.manual_seed(3)
    scales = model._drop_scales(tokens)
    rates = [layer.drop_path.p if hasattr(layer.drop_path, 'p') else 0.0
             for layer in model.layers]
    assert scales.shape == (3, 64) and rates[0] == 0.0 and rates[2] > 0
    for row, p in zip(scales, rates):
        allowed = torch.tensor([1.0] if p == 0 else [0.0, 1 / (1 - p)])
        assert torch.isclose(row[:, None], allowed).any(1).all(), (row, p)
    assert (scales[2] == 0).any() and (scales[2] > 0).any()
    torch.manual_seed(3)
    [got] = model.run_blocks(tokens, [2])
    [want] = blocks_loop(tokens, *_stack_args(model), scales)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert model.eval()._drop_scales(tokens) is None
    assert tiny(drop_path_rate=0.0).train()._drop_scales(tokens) is None


def test_intermediate_outputs_use_the_same_draw_as_the_whole_stack():
    """Asking for every block's output runs the blocks one by one with the same
    factors: the last block's output equals the one-call stack's."""
    model = tiny(out_indices=[0, 1, 2]).train()
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(5)
    per_block = model(x)[-1]
    model.out_indices = [2]
    torch.manual_seed(5)
    stacked = model(x)[0]
    assert torch.equal(per_block, stacked)


def test_the_stack_runner_is_the_one_seam_for_running_the_blocks():
    """DinoVim runs its blocks through ``stack_runner(tokens, indices)`` (None: its
    own one-call ``run_blocks``): a runner gets the sorted, unique indices and its
    pairs become the outputs; ``loop_blocks`` (the block modules one at a time)
    gives ``run_blocks``'s numbers with the same draw."""
    model = tiny(out_indices=[2, 0, 2]).train()
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(7)
    want = model(x)
    calls = []

    def runner(tokens, indices):
        calls.append(list(indices))
        return model.loop_blocks(tokens, indices)

    model.stack_runner = runner
    torch.manual_seed(7)
    got = model(x)
    assert calls == [[0, 2]]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    tokens = torch.randn(4, 18, 32)
    for indices in ([2], [0, 1, 2]):
        torch.manual_seed(8)
        loop = model.loop_blocks(tokens, indices)
        torch.manual_seed(8)
        one_call = model.run_blocks(tokens, indices)
        assert len(loop) == len(indices)
        assert all(torch.equal(a, b) for pair, other in zip(loop, one_call)
                   for a, b in zip(pair, other))


def test_hooks_on_blocks_see_their_calls():
    """A hook on a block, a mixer or in_proj keeps the blocks in the module loop, so
    it sees the calls it saw before the one-call stack; the numbers are the same."""
    model = tiny().eval()
    x = torch.randn(2, 3, 32, 32)
    plain = model(x)[0]
    for module in (model.layers[2], model.layers[1].mixer, model.layers[0].mixer.in_proj):
        seen = []
        handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        out = model(x)[0]
        handle.remove()
        assert len(seen) == 1 and torch.equal(out, plain)
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, args, out: seen.append(m))
    model(x)
    handle.remove()
    assert any(m is model.layers[1].mixer for m in seen)



@pytest.mark.gpu
@pytest.mark.parametrize('amp', [None, torch.bfloat16])
def test_fused_stack_equals_the_block_modules_on_the_gpu(amp):
    """DinoVim with one call for its blocks (the default) against the block modules
    called one at a time: two training steps with stochastic depth, the same losses
    and gradients (the same kernels in the same order; the scan's backward sums
    with atomics, so not always to the bit), and a no-grad forward to the bit."""
    torch.manual_seed(0)
    fused = DinoVim(arch=dict(embed_dims=64, num_layers=4), img_size=32, patch_size=8,
                    drop_path_rate=0.3, mixer_cfg=dict(d_state=16, headdim=32)).cuda()
    loop = copy.deepcopy(fused)
    loop.stack_runner = loop.loop_blocks
    x = torch.randn(8, 3, 32, 32, device='cuda')
    for step in range(2):
        results = []
        for model in (fused, loop):
            model.train().zero_grad(set_to_none=True)
            torch.manual_seed(10 + step)
            with torch.autocast('cuda', dtype=amp or torch.float32,
                                enabled=amp is not None):
                loss = model(x)[0].float().square().mean()
            loss.backward()
            results.append((loss.detach(), [p.grad for p in model.parameters()]))
        (loss_f, grads_f), (loss_l, grads_l) = results
        torch.testing.assert_close(loss_f, loss_l, rtol=1e-5, atol=0)
        for g, e in zip(grads_f, grads_l):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3 * e.abs().max().item())
    with torch.no_grad():
        for model in (fused, loop):
            model.eval()
        assert torch.equal(fused(x)[0], loop(x)[0])
