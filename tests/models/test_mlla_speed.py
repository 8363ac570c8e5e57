"""MLLA's fast paths and the settings the benchmarks run it in: one RoPE table per
grid and stage (against the table built in every mixer call, its slow twin: the
same numbers, bit for bit), 1024 px inputs, bf16 autocast and torch.compile."""
import copy

import pytest
import torch

import mmdinomamba.models.mixers.linear_attention_mixer as mixer_module
import mmdinomamba.models.mixers.positional as positional
from mmdinomamba.models.mixers import LinearAttentionMixer
from mmdinomamba.models.mixers.positional import rope_2d, rope_2d_table
from tests.factories import PLAIN_MLLA_TINY, mlla, mlla_arch, plain_mlla

ARCH = mlla_arch(depths=[2, 2, 2, 1])


def model_of(**kwargs):
    return mlla(arch=ARCH, out_indices=(0, 1, 2, 3), **kwargs)


def per_call(model):
    """The slow twin: every mixer call builds its own RoPE table (the stages'
    ``share_rope_table`` switch, which the benchmark's ``mlla-*-rope-per-call``
    models turn off)."""
    slow = copy.deepcopy(model)
    for stage in slow.layers:
        stage.share_rope_table = False
    return slow


def outputs_and_grads(model, x):
    outs = model(x)
    loss = sum(o.float().square().sum() for o in outs)
    return outs, torch.autograd.grad(loss, list(model.parameters()))


def test_rope_with_a_table_is_rope_without_one():
    """Bit for bit: the table holds the numbers rope_2d builds per call; Q and K
    stacked on an axis of their own turn as each alone."""
    torch.manual_seed(0)
    hw = (3, 5)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.randn(2, 15, 2, 12).to(dtype)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        table = rope_2d_table(hw, 12, dtype=compute)
        shared = rope_2d(x, hw, table=table)
        assert shared.dtype == compute and shared.shape == x.shape
        for i in range(2):
            assert torch.equal(shared[:, :, i], rope_2d(x[:, :, i], hw))
    with pytest.raises(ValueError, match=r'two \(15, 6\) tensors'):
        rope_2d(torch.randn(1, 15, 12), hw, table=rope_2d_table((5, 3), 8))
    with pytest.raises(ValueError, match='torch.float32 for torch.float32 input'):
        rope_2d(torch.randn(1, 15, 12), hw, table=rope_2d_table(hw, 12,
                                                                 dtype=torch.float64))
    with pytest.raises(ValueError, match='batch, seqlen, ..., dim'):
        rope_2d(torch.randn(15, 12), hw)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_mixer_with_the_grids_table_equals_the_mixer_without(dtype):
    torch.manual_seed(0)
    mixer = LinearAttentionMixer(16, 2, rope=True, lepe=True).to(dtype)
    u = torch.randn(2, 12, 16, dtype=dtype, requires_grad=True)
    table = mixer.rope_table((3, 4), u)
    fast = mixer(u, (3, 4), table)
    slow = mixer(u, (3, 4))
    assert torch.equal(fast, slow)
    for a, b in zip(torch.autograd.grad(fast.sum(), [u, *mixer.parameters()]),
                    torch.autograd.grad(slow.sum(), [u, *mixer.parameters()])):
        assert torch.equal(a, b)
    assert LinearAttentionMixer(16, 2).rope_table((3, 4), u) is None  # no RoPE


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_mlla_shares_one_table_per_stage_with_the_same_numbers(dtype):
    """Forward and gradients equal to the tables built per mixer call (the
    code before the shared tables), bit for bit, on a rectangular input."""
    model = model_of(drop_path_rate=0.0).to(dtype)
    slow = per_call(model)
    x = torch.randn(2, 3, 64, 96, dtype=dtype)
    outs, grads = outputs_and_grads(model, x)
    slow_outs, slow_grads = outputs_and_grads(slow, x)
    assert all(torch.equal(a, b) for a, b in zip(outs, slow_outs))
    assert all(torch.equal(a, b) for a, b in zip(grads, slow_grads))


def test_mlla_builds_one_table_per_stage(monkeypatch):
    """The table is built once per stage and forward, not in each of the 7
    blocks' mixers (the per-call twin: one table each)."""
    calls = []
    build = positional.rope_2d_angles

    def counted(*args, **kwargs):
        calls.append(args[0])
        return build(*args, **kwargs)

    monkeypatch.setattr(positional, 'rope_2d_angles', counted)
    model = model_of().eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        model(x)
        assert calls == [(16, 16), (8, 8), (4, 4), (2, 2)]
        calls.clear()
        slow = per_call(model)
        assert all(stage.rope_table((16, 16), x) is None for stage in slow.layers)
        slow(x)
    assert len(calls) == sum(ARCH['depths'])


def test_plain_mlla_shares_one_table_with_the_same_numbers(monkeypatch):
    model = plain_mlla(arch=mlla_arch(PLAIN_MLLA_TINY, embed_dims=32), img_size=32,
                       patch_size=8, drop_path_rate=0.0).eval()
    x = torch.randn(2, 3, 32, 32)
    built = []

    def counted(hw, *args, **kwargs):
        built.append(hw)
        return rope_2d_table(hw, *args, **kwargs)

    monkeypatch.setattr(mixer_module, 'rope_2d_table', counted)
    with torch.no_grad():
        fast = model(x)[0]
        assert built == [(4, 4)]
        tokens, layout = model.embed(x)
        slow = tokens
        for layer in model.layers:  # each mixer call builds its own table
            slow = layer(slow, layout.hw)
    assert built == [(4, 4)] * (1 + len(model.layers))
    assert torch.equal(model.norm(slow).mean(dim=1), fast)


def test_1024px_on_an_img_size_224_model_with_bf16_autocast():
    """No resolution-bound buffer: a model made for 224 px trains at 1024 px
    (a 256 x 256 grid in the first stage), under CPU bf16 autocast as the
    benchmarks run it, and matches float32 to bf16's accuracy."""
    model = mlla(arch=mlla_arch(embed_dims=8, num_heads=[1, 1, 1, 1]), img_size=224,
                 out_indices=(0, 3), drop_path_rate=0.0)
    assert all(name.endswith(('running_mean', 'running_var', 'num_batches_tracked'))
               for name, _ in model.named_buffers())  # BatchNorm's only
    x = torch.randn(1, 3, 1024, 1024)
    with torch.no_grad():
        ref = model(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(x)
    assert [tuple(o.shape) for o in out] == [(1, 8, 256, 256), (1, 64, 32, 32)]
    for o, r in zip(out, ref):
        assert o.dtype == torch.bfloat16
        # relative to the whole map: bf16 rounds to 2^-9 at every product and
        # norm, a few percent after four stages of a randomly initialised model
        # (measured 1 % and 3 %); a RoPE or table in the wrong place is O(1) off
        err = ((o.double() - r.double()).norm() / r.double().norm()).item()
        assert err < 0.05
    out[-1].float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()
               if p.grad is not None)


@pytest.mark.slow
def test_one_graph_under_torch_compile():
    """Training mode with stochastic depth on: dynamo traces the whole backbone
    (the stage tables included) as one graph."""
    torch._dynamo.reset()
    model = model_of(drop_path_rate=0.2).train()
    explanation = torch._dynamo.explain(model)(torch.randn(2, 3, 64, 64))
    assert explanation.graph_break_count == 0, [
        str(b.reason)[:200] for b in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_compiled_equals_eager():
    """aot_eager traces forward and backward as the compiler does (Inductor's code
    generation aside): the same outputs and gradients in float64."""
    torch._dynamo.reset()
    model = model_of(drop_path_rate=0.0).double().train()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    compiled = torch.compile(model, backend='aot_eager', fullgraph=True)
    outs_c, grads_c = outputs_and_grads(compiled, x)
    outs_e, grads_e = outputs_and_grads(model, x)
    for c, e in zip(outs_c, outs_e):
        torch.testing.assert_close(c, e, rtol=1e-12, atol=1e-12)
    for c, e in zip(grads_c, grads_e):
        torch.testing.assert_close(c, e, rtol=1e-10, atol=1e-12)


def test_every_block_reads_contiguous_tokens_and_convs_read_channels_last():
    """The stem and the downsampling MBConvs run channels-last and hand on
    contiguous tokens, so no block works on strided tokens (on a GPU a strided
    residual stream turns every add into a non-vectorised kernel and every
    depthwise conv into a layout copy), for an even and an odd grid."""
    model = mlla().eval()
    seen = []

    def block_input(module, args):
        seen.append(('block', args[0].is_contiguous()))

    def conv_input(module, args):
        seen.append(('conv', args[0].is_contiguous(memory_format=torch.channels_last)))

    for stage in model.layers:
        for block in stage.blocks:
            block.register_forward_pre_hook(block_input)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and module.in_channels > 3:
            module.register_forward_pre_hook(conv_input)
    for size in (64, 56):  # grids 16, 8, 4, 2 and 14, 7, 4, 2
        seen.clear()
        with torch.no_grad():
            model(torch.randn(2, 3, size, size))
        assert {kind for kind, _ in seen} == {'block', 'conv'}
        assert all(ok for _, ok in seen), [kind for kind, ok in seen if not ok]
