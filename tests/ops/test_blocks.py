"""A stack of DinoVim blocks in one call (ops/blocks.py, ops/triton/blocks.py).

The PyTorch twin ``blocks_loop`` is checked against the blocks' own modules called
one after the other; the fused stack (one autograd node) against the twin in float64
and, bit for bit, against the per-block fused path it replaces (the same kernels in
the same order), on the CPU through Triton's interpreter.
"""
import copy
import os.path as osp
import sys

import pytest
import torch

from mmdinomamba.models.backbones import DinoVim
from mmdinomamba.ops import blocks_loop, run_blocks, uses_fused_blocks

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from test_ssd_triton_interpret import TOL, run_in_interpreter  # noqa: E402


def tiny(**kw):
    torch.manual_seed(0)
    kw = dict(dict(drop_path_rate=0.5, mixer_cfg=dict(d_state=16, headdim=16)), **kw)
    return DinoVim(arch=dict(embed_dims=32, num_layers=3), img_size=32, patch_size=8,
                   **kw)


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


SCRIPT = r'''
from mmdinomamba.models.backbones import DinoVim
from mmdinomamba.ops import blocks_loop
from mmdinomamba.ops.triton import add_rms_norm_triton, blocks_triton, mixer_core_triton

def per_block_fused(tokens, model, scales, indices=None):
    """The path blocks_triton replaces: three autograd nodes per block; the last
    block's (h, residual), or with indices a list of those blocks' pairs."""
    h, residual, outs = tokens, None, []
    for i, layer in enumerate(model.layers):
        scale = scales[i] if scales is not None and residual is not None else None
        residual, normed = add_rms_norm_triton(h, residual, layer.norm.weight,
                                               layer.norm.eps, normed_dtype, scale)
        m = layer.mixer
        h = mixer_core_triton(m.in_proj(normed), m.core_params(), m.spec)
        outs.append((h, residual))
    return (h, residual) if indices is None else [outs[i] for i in indices]

cases = {
    'bidir': dict(),
    'bias': dict(mixer_cfg=dict(d_state=16, headdim=16, bias=True, conv_bias=False)),
    'causal': dict(mixer_cfg=dict(d_state=16, headdim=16, bidirectional=False)),
}
for key, kw in cases.items():
    torch.manual_seed(0)
    kw.setdefault('mixer_cfg', dict(d_state=16, headdim=16))
    model = DinoVim(arch=dict(embed_dims=32, num_layers=3), img_size=32, patch_size=8,
                    **kw)
    for p in model.parameters():  # every parameter away from its initial value
        p.data += 0.1 * torch.randn_like(p)
    model.train()
    params = [l.params() for l in model.layers]
    specs = [l.spec() for l in model.layers]
    tokens = torch.randn(3, 21, 32, requires_grad=True)
    scales = torch.tensor([[1., 1., 1.], [0., 1.25, 1.25], [2., 2., 0.]])
    weights = [tokens, *model.layers.parameters()]
    dh, dres = torch.randn(3, 21, 32), torch.randn(3, 21, 32)
    normed_dtype = torch.float32
    [got] = blocks_triton(tokens, params, specs, scales)
    g = torch.autograd.grad(got, weights, (dh, dres))
    # the twin in float64
    model64 = model.double()
    [ref] = blocks_loop(tokens.double(), [l.params() for l in model64.layers], specs,
                        scales.double())
    g_ref = torch.autograd.grad(ref, [tokens, *model64.layers.parameters()],
                                (dh.double(), dres.double()))
    model.float()
    errors[key + '.h'] = rel(got[0], ref[0])
    errors[key + '.residual'] = rel(got[1], ref[1])
    names = ['tokens'] + [n for n, _ in model.layers.named_parameters()]
    for name, a, b in zip(names, g, g_ref):
        errors[key + '.d' + name] = rel(a, b)
    # the per-block fused path: the same kernels in the same order, the same bits
    want = per_block_fused(tokens, model, scales)
    g_want = torch.autograd.grad(want, weights, (dh, dres))
    errors[key + '.bits'] = max((a - b).abs().max().item()
                                for a, b in zip((*got, *g), (*want, *g_want)))
    with torch.no_grad():  # the forward alone, no autograd node
        [nograd] = blocks_triton(tokens, params, specs, scales)
    errors[key + '.no_grad_bits'] = max((a - b).abs().max().item()
                                        for a, b in zip(nograd, got))

    # the outputs of blocks 0 and 1 (block 2 does not run), gradients entering
    # through block 0's h and block 1's residual only (the others unused)
    pairs = blocks_triton(tokens, params, specs, scales, indices=[0, 1])
    want = per_block_fused(tokens, model, scales, indices=[0, 1])
    loss = (pairs[0][0] * dh).sum() + (pairs[1][1] * dres).sum()
    loss_want = (want[0][0] * dh).sum() + (want[1][1] * dres).sum()
    g = torch.autograd.grad(loss, weights, allow_unused=True)
    g_want = torch.autograd.grad(loss_want, weights, allow_unused=True)
    errors[key + '.indices_bits'] = max(
        [(a - b).abs().max().item() for pair, w in zip(pairs, want)
         for a, b in zip(pair, w)]
        + [(a - b).abs().max().item() for a, b in zip(g, g_want) if b is not None])
    errors[key + '.indices_unrun'] = float(sum(  # block 2's gradients: none
        a is not None for a, (n, _) in zip(g[1:], model.layers.named_parameters())
        if n.startswith('2.')))

# a half-precision compute dtype (autocast): the same bits as the per-block path,
# which then keeps the normalised rows in float16 (no float32 row of the stream)
torch.manual_seed(0)
model = DinoVim(arch=dict(embed_dims=32, num_layers=2), img_size=32, patch_size=8,
                mixer_cfg=dict(d_state=16, headdim=16)).train()
tokens = torch.randn(2, 21, 32, requires_grad=True)
weights = [tokens, *model.layers.parameters()]
dh, dres = torch.randn(2, 21, 32).half(), torch.randn(2, 21, 32)
with torch.autocast('cpu', dtype=torch.float16):
    [got] = blocks_triton(tokens, [l.params() for l in model.layers],
                          [l.spec() for l in model.layers])
    normed_dtype = torch.float16
    want = per_block_fused(tokens, model, None)
errors['half.dtype'] = float(got[0].dtype != torch.float16)
g = torch.autograd.grad(got, weights, (dh, dres))
g_want = torch.autograd.grad(want, weights, (dh, dres))
errors['half.bits'] = max((a.float() - b.float()).abs().max().item()
                          for a, b in zip((*got, *g), (*want, *g_want)))

# a frozen stack (no parameter and no input needing a gradient, grad mode on, as a
# linear probe's backbone) records no node and keeps nothing for a backward
import mmdinomamba.ops.triton.blocks as tb
with torch.no_grad():
    [want] = blocks_triton(tokens, [l.params() for l in model.layers],
                           [l.spec() for l in model.layers])
apply, tb._Blocks.apply = tb._Blocks.apply, None  # calling it would raise
for p in model.layers.parameters():
    p.requires_grad_(False)
[got] = blocks_triton(tokens.detach(), [l.params() for l in model.layers],
                      [l.spec() for l in model.layers])
tb._Blocks.apply = apply
for p in model.layers.parameters():
    p.requires_grad_(True)
errors['frozen_bits'] = max((a - b).abs().max().item() for a, b in zip(got, want))
errors['frozen.requires_grad'] = float(got[0].requires_grad)

# a second backward through one forward is refused with a clear error
[out] = blocks_triton(tokens, [l.params() for l in model.layers],
                      [l.spec() for l in model.layers])
loss = out[0].sum() + out[1].sum()
loss.backward(retain_graph=True)
try:
    loss.backward()
    errors['second_backward_refused'] = 1.0
except RuntimeError as err:
    errors['second_backward_refused'] = 0.0 if 'already' in str(err) else 2.0
'''


def test_fused_stack_in_interpreter():
    errors = run_in_interpreter(SCRIPT)
    for key in ('bidir', 'bias', 'causal'):
        assert {f'{key}.h', f'{key}.dtokens', f'{key}.bits', f'{key}.no_grad_bits',
                f'{key}.d0.mixer.in_proj.weight', f'{key}.d2.norm.weight',
                f'{key}.indices_bits'} <= set(errors)
        assert errors[f'{key}.indices_unrun'] == 0.0
    assert {'bias.d1.mixer.in_proj.bias', 'bias.d1.mixer.out_proj.bias',
            'causal.d2.mixer.A_log'} <= set(errors)
    bits = {k: v for k, v in errors.items() if k.endswith('bits') and v != 0.0}
    assert not bits, bits
    assert errors['half.dtype'] == 0.0 and errors['second_backward_refused'] == 0.0
    assert errors['frozen.requires_grad'] == 0.0 and 'frozen_bits' in errors
    flags = ('bits', 'dtype', 'refused', 'requires_grad', 'unrun')
    bad = {k: v for k, v in errors.items() if not k.endswith(flags) and not v < TOL}
    assert not bad, bad


def _cuda_triton():
    from mmdinomamba.ops import triton_available
    return torch.cuda.is_available() and triton_available()


@pytest.mark.skipif(not _cuda_triton(), reason='needs CUDA and Triton')
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
