"""DinoVim's blocks and MLLA's stages replayed from CUDA graphs
(engine/graphed_blocks.py): the same
forward, gradients and stochastic-depth draws as the eager blocks, on the GPU; the
bookkeeping (one capture per signature, eager when a signature's backward is still
pending, eager on a CPU) on the CPU."""
import copy

import pytest
import torch

import mmdinomamba.engine.graphed_blocks as gb
from tests.factories import dinovim, mlla, mlla_arch


def tiny(drop_path_rate=0.2, layers=3):
    return dinovim(64, layers, img_size=32, patch_size=8, drop_path_rate=drop_path_rate,
                   mixer_cfg=dict(d_state=16, headdim=32))


def test_cpu_inputs_run_the_eager_blocks():
    model = tiny().train()
    twin = copy.deepcopy(model)
    assert gb.graph_blocks(model) == ['']
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    out = model(x)[0]
    torch.manual_seed(1)
    torch.testing.assert_close(out, twin(x)[0], rtol=0, atol=0)
    assert model.stack_runner.graphs._graphs == {}  # nothing captured
    gb.graph_blocks(model, enabled=False)
    assert model.stack_runner is None


@pytest.fixture
def fake_captures(monkeypatch):
    """A fake capture (the eager stack) stands in for CUDA on any tensor: returns the
    lists of captures ``(shape, grad)`` and of replays ``shape``, in call order."""
    captures, replays = [], []

    def fake_capture(self, tokens, training, grad, context=()):
        captures.append((tuple(tokens.shape), grad))
        stack = gb._Stack(self.layers, training, self.run, context)

        def replay(x):
            replays.append(tuple(x.shape))
            return stack(x)
        return replay

    monkeypatch.setattr(gb.GraphedBlocks, 'takes', staticmethod(lambda t: True))
    monkeypatch.setattr(gb.GraphedBlocks, '_capture', fake_capture)
    return captures, replays


def test_one_capture_per_signature_and_eager_while_a_backward_is_pending(fake_captures):
    """What is captured when, and which calls replay."""
    captures, replays = fake_captures
    model = tiny(drop_path_rate=0.0).train()
    gb.graph_blocks(model)
    x, small = torch.randn(2, 3, 32, 32), torch.randn(4, 3, 16, 16)

    a = model(x)[0]
    b = model(x)[0]  # the first one's backward has not run: eager
    # 32 px, 8 px patches: 16 patches and the [CLS] token twice
    assert captures == [((2, 18, 64), True)] and replays == [(2, 18, 64)]
    (a.sum() + b.sum()).backward()
    model(x)[0].sum().backward()  # replays again
    model(small)[0].sum().backward()  # a second signature: its own capture
    with torch.no_grad():
        model(x)
    assert captures == [((2, 18, 64), True), ((4, 6, 64), True), ((2, 18, 64), False)]
    assert replays == [(2, 18, 64), (2, 18, 64), (4, 6, 64), (2, 18, 64)]
    # intermediate outputs are asked for: eager, no capture
    tokens, _ = model.embed(x)
    model.forward_tokens(tokens, [0, 2])
    assert len(captures) == 3


def test_inputs_beyond_max_signatures_run_eagerly_with_one_warning(fake_captures):
    """Without ``evict`` (training runners) the first captures stay."""
    captures, _ = fake_captures
    blocks = gb.GraphedBlocks(tiny(drop_path_rate=0.0).layers, max_signatures=2)
    with torch.no_grad():
        for n in (4, 5, 4):
            blocks(torch.randn(1, n, 64), training=False)
        with pytest.warns(UserWarning, match='more than 2 input signatures; further '
                          'ones run eagerly'):
            blocks(torch.randn(1, 6, 64), training=False)
        blocks(torch.randn(1, 7, 64), training=False)  # eager, no second warning
        blocks(torch.randn(1, 6, 64), training=False)  # eager again
    assert [shape for shape, _ in captures] == [(1, 4, 64), (1, 5, 64)]
    assert blocks.evictions == 0


def test_beyond_max_signatures_the_least_recently_used_graph_is_freed(fake_captures):
    """With ``evict`` (inference runners), an LRU bound: a new signature on a
    full cache frees the graph used longest ago (nothing holds it after: its pool
    goes with it), with one warning; the replays stay the eager numbers."""
    import gc
    import weakref
    captures, replays = fake_captures
    blocks = gb.GraphedBlocks(tiny(drop_path_rate=0.0).layers, max_signatures=2,
                              evict=True)
    stack = gb._Stack(blocks.layers, False)
    inputs = {n: torch.randn(1, n, 64) for n in (4, 5, 6, 7)}
    with torch.no_grad():
        for n in (4, 5, 4):  # 4 is now the most recently used
            blocks(inputs[n], training=False)
        first = {k[0][1]: weakref.ref(f) for k, f in blocks._graphs.items()}
        with pytest.warns(UserWarning, match='more than 2 input signatures; the least '
                          'recently used'):
            out = blocks(inputs[6], training=False)  # frees 5's graph
        torch.testing.assert_close(out, stack(inputs[6]), rtol=0, atol=0)
        gc.collect()
        assert first[5]() is None and first[4]() is not None
        blocks(inputs[7], training=False)  # frees 4's, no second warning
        blocks(inputs[6], training=False)  # a replay
        out = blocks(inputs[5], training=False)  # captured again, frees 7's
        torch.testing.assert_close(out, stack(inputs[5]), rtol=0, atol=0)
    assert [shape[1] for shape, _ in captures] == [4, 5, 6, 7, 5]
    assert [shape[1] for shape in replays] == [4, 5, 4, 6, 7, 6, 5]
    assert [k[0][1] for k in blocks._graphs] == [6, 5] and blocks.evictions == 3


def test_capture_after_runs_a_signature_eagerly_until_it_recurs(fake_captures):
    captures, replays = fake_captures
    blocks = gb.GraphedBlocks(tiny(drop_path_rate=0.0).layers, max_signatures=2,
                              capture_after=2, evict=True)
    with torch.no_grad():
        for n in (4, 5, 4, 6, 4, 5):
            blocks(torch.randn(1, n, 64), training=False)
    # 4 captured on its second call, 5 on its second; 6 (once) never
    assert [shape[1] for shape, _ in captures] == [4, 5]
    assert [shape[1] for shape in replays] == [4, 4, 5]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match='capture_after must be a positive int'):
            gb.GraphedBlocks(blocks.layers, capture_after=bad)


def test_inference_graphs_take_any_blocks_outputs_and_leave_training_eager(
        fake_captures):
    """``graph_blocks(training=False)``: no-grad calls replay, for the last block
    and for a dense model's feature maps (one signature per set of blocks, the
    eager numbers); calls that need a gradient run eagerly."""
    captures, replays = fake_captures
    model = tiny(drop_path_rate=0.0, layers=4).eval()
    twin = copy.deepcopy(model)
    gb.graph_blocks(model, training=False, max_signatures=4)
    tokens = torch.randn(2, 18, 64)
    with torch.no_grad():
        for indices in ([3], [0, 2, 3], [1, 3], [0, 2, 3]):
            for a, b in zip(model.forward_tokens(tokens, indices),
                            twin.forward_tokens(tokens, indices)):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert captures == [((2, 18, 64), False)] * 3 and len(replays) == 4
    blocks = model.stack_runner.graphs
    assert (blocks.training, blocks.evict, blocks.max_signatures) == (False, True, 4)
    keys = list(blocks._graphs)
    assert [k[-1] for k in keys] == [((3, ), ), ((1, 3), ), ((0, 2, 3), )]  # LRU order
    model.forward_tokens(tokens, [3])[0].sum().backward()  # grad: eager
    assert len(captures) == 3 and model.layers[0].norm.weight.grad is not None


def test_frozen_input_with_trainable_blocks_is_a_training_signature(fake_captures):
    """Tokens that need no gradient (a frozen embedding) still make a training
    capture while the blocks' parameters need one; all frozen, a forward-only one."""
    captures, _ = fake_captures
    model = tiny(drop_path_rate=0.0).train()
    gb.graph_blocks(model)
    tokens = torch.randn(2, 18, 64)
    model.forward_tokens(tokens, [2])[0].sum().backward()
    assert [grad for _, grad in captures] == [True]
    assert model.layers[0].norm.weight.grad is not None
    model.layers.requires_grad_(False)
    model.forward_tokens(tokens, [2])
    assert [grad for _, grad in captures] == [True, False]


def test_the_hook_switches_every_dinovim_of_the_model_and_names_them():
    from mmdinomamba.engine.hooks import CUDAGraphBlocksHook

    class Runner:
        def __init__(self, model):
            self.model = model
            self.logger = type('L', (), {'info': lambda s, msg: logs.append(msg),
                                         'warning': lambda s, msg: logs.append(msg)})()

    logs = []
    model = torch.nn.ModuleDict(dict(backbone=tiny(), teacher=tiny()))
    CUDAGraphBlocksHook().before_train(Runner(model))
    assert isinstance(model['backbone'].stack_runner, gb.GraphedStack)
    assert isinstance(model['teacher'].stack_runner, gb.GraphedStack)
    assert '`backbone`' in logs[0] and '`teacher`' in logs[0]
    CUDAGraphBlocksHook().before_train(Runner(torch.nn.Linear(2, 2)))  # a ViT, say
    assert 'no module of the model (Linear)' in logs[1] and 'eagerly' in logs[1]


def tiny_mlla(drop_path_rate=0.2, out_indices=(1, 3)):
    return mlla(arch=mlla_arch(depths=[1, 2, 1, 1]), out_indices=out_indices,
                drop_path_rate=drop_path_rate)


def test_mlla_stages_one_capture_per_stage_and_grid(fake_captures):
    """One capture per stage and grid: a transposed input has the same token counts
    but other grids, so it captures again; the replays give the eager numbers."""
    captures, replays = fake_captures
    model = tiny_mlla(drop_path_rate=0.0).train()
    twin = copy.deepcopy(model)
    assert gb.graph_blocks(model) == ['']
    assert isinstance(model.stage_runner, gb.GraphedStages)
    wide, tall = torch.randn(2, 3, 32, 64), torch.randn(2, 3, 64, 32)
    for x in (wide, wide, tall):
        outs = model(x)
        sum(o.sum() for o in outs).backward()
        for a, b in zip(outs, twin(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    grids = [(2, 128, 16), (2, 32, 32), (2, 8, 64), (2, 2, 128)]  # tokens per stage
    assert captures == [(g, True) for g in grids] * 2  # wide, then tall
    assert replays == grids * 3
    assert all(len(g._graphs) == 2 for g in model.stage_runner.graphs)
    # per-block outputs (the analysis API) run eagerly, nothing new captured
    model.forward_intermediates(wide, indices=[1])
    assert len(captures) == 8
    gb.graph_blocks(model, enabled=False)
    assert model.stage_runner is None


def test_mlla_on_cpu_runs_eagerly_and_the_hook_names_it():
    from mmdinomamba.engine.hooks import CUDAGraphBlocksHook
    model = tiny_mlla().train()
    twin = copy.deepcopy(model)
    logs = []
    runner = type('R', (), dict(model=model, logger=type('L', (), {
        'info': lambda s, msg: logs.append(msg)})()))()
    CUDAGraphBlocksHook(max_signatures=3).before_train(runner)
    assert 'MLLA' in logs[0]
    assert all(g.max_signatures == 3 for g in model.stage_runner.graphs)
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    out = model(x)
    torch.manual_seed(1)
    for a, b in zip(out, twin(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert all(g._graphs == {} for g in model.stage_runner.graphs)
    with pytest.raises(ValueError, match='max_signatures must be a positive int'):
        CUDAGraphBlocksHook(max_signatures=0)


@pytest.mark.gpu
def test_graphed_mlla_training_steps_equal_eager_steps_with_drop_path():
    """MLLA's stages: three steps over two input sizes, bf16 autocast, drop path."""
    eager = tiny_mlla(drop_path_rate=0.3, out_indices=(3, )).cuda().train()
    graphed = copy.deepcopy(eager)
    gb.graph_blocks(graphed)
    inputs = [torch.randn(8, 3, 64, 64, device='cuda'),
              torch.randn(4, 3, 96, 64, device='cuda')]
    want = _train_steps(eager, inputs, 3, seed=5)
    got = _train_steps(graphed, inputs, 3, seed=5)
    assert all(len(g._graphs) == 2 for g in graphed.stage_runner.graphs)
    for (loss_g, grads_g), (loss_e, grads_e) in zip(got, want):
        torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=0)
        for g, e in zip(grads_g, grads_e):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3 * e.abs().max().item())
    # the steps differ from each other (new drop-path draws each step); the loss
    # cannot show it: the last stage ends in a LayerNorm of unit weight and zero bias,
    # so the mean square of its output is 1 whatever the mask, but the gradients do
    assert not all(torch.equal(a, b) for a, b in zip(want[0][1], want[1][1])
                   if a is not None)


def _train_steps(model, inputs, steps, seed, set_to_none=True):
    """Loss and gradients of ``steps`` steps (one step: every input shape, fp16
    autocast with its weight cache on, as mmengine's AmpOptimWrapper), from
    ``seed``."""
    torch.cuda.manual_seed(seed)
    results = []
    for _ in range(steps):
        model.zero_grad(set_to_none=set_to_none)
        with torch.autocast('cuda', dtype=torch.float16):
            loss = sum(model(x)[0].float().pow(2).mean() for x in inputs)
        loss.backward()
        results.append((loss.detach(), [None if p.grad is None else p.grad.clone()
                                        for p in model.parameters()]))
    return results


@pytest.mark.gpu
@pytest.mark.parametrize('frozen_embedding', [False, True])
def test_graphed_training_steps_equal_eager_steps_with_drop_path(frozen_embedding):
    """Three steps over two shapes (capture, then replays): the same losses and
    parameter gradients as eager, and the same stochastic-depth draws (a different
    mask would change the loss by far more than the tolerance). With the embedding
    frozen the blocks' input needs no gradient, their parameters still do."""
    eager = tiny(drop_path_rate=0.3, layers=4).cuda().train()
    if frozen_embedding:
        for p in (eager.patch_embed, eager.cls_token, eager.pos_embed):
            p.requires_grad_(False)
    graphed = copy.deepcopy(eager)
    gb.graph_blocks(graphed)
    inputs = [torch.randn(8, 3, 32, 32, device='cuda'),
              torch.randn(16, 3, 16, 16, device='cuda')]
    want = _train_steps(eager, inputs, 3, seed=5)
    got = _train_steps(graphed, inputs, 3, seed=5)
    assert len(graphed.stack_runner.graphs._graphs) == 2
    for (loss_g, grads_g), (loss_e, grads_e) in zip(got, want):
        # the same kernels in the same order: equal but for atomics' summation order
        torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=0)
        for g, e in zip(grads_g, grads_e):
            if e is None:  # frozen
                assert g is None
                continue
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3 * e.abs().max().item())
    # the steps differ from each other (new drop-path draws each step)
    assert not torch.equal(want[0][0], want[1][0])


@pytest.mark.gpu
def test_graphed_no_grad_forward_equals_eager_and_follows_in_place_updates():
    """The teacher's pass: no grad, eval mode; parameters updated in place between
    calls (the EMA) are read by the replay."""
    eager = tiny(layers=4).cuda().eval()
    graphed = copy.deepcopy(eager)
    gb.graph_blocks(graphed)
    x = torch.randn(8, 3, 32, 32, device='cuda')
    for _ in range(3):
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.float16):
            out_g, out_e = graphed(x)[0].clone(), eager(x)[0]
        torch.testing.assert_close(out_g, out_e, rtol=0, atol=0)
        with torch.no_grad():
            for m in (eager, graphed):
                torch._foreach_mul_(list(m.parameters()), 0.9)
    assert len(graphed.stack_runner.graphs._graphs) == 1


@pytest.mark.gpu
def test_the_warm_up_hands_its_side_stream_memory_back():
    """What the warm-up frees on its side stream would stay cached for that stream
    alone (reserved, unusable by the training stream) unless handed back: a warm-up
    whose temporaries take 256 MiB leaves the reservation where it was."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()

    def step():
        big = torch.ones(64 * 2**20, device='cuda')  # 256 MiB, freed on return
        return big.sum()

    gb._warm_up(step, torch.device('cuda'), warmup=2)
    assert torch.cuda.memory_reserved() - before < 32 * 2**20


@pytest.mark.gpu
@pytest.mark.parametrize('set_to_none', [True, False])
def test_one_signature_gradients_are_not_the_graphs_buffers(set_to_none):
    """The backward hands autograd the backward graph's own gradient buffers; a
    parameter's .grad must still be a tensor of its own (else the next replay would
    rewrite it, and .grad zeroed in place would zero the graph's output): steps of
    one shape, .grad set to None or zeroed in place between them, equal eager's."""
    eager = tiny(drop_path_rate=0.0, layers=3).cuda().train()
    graphed = copy.deepcopy(eager)
    gb.graph_blocks(graphed)
    inputs = [torch.randn(8, 3, 32, 32, device='cuda')]
    want = _train_steps(eager, inputs, 3, seed=1, set_to_none=set_to_none)
    got = _train_steps(graphed, inputs, 3, seed=1, set_to_none=set_to_none)
    (replay, ) = graphed.stack_runner.graphs._graphs.values()
    static = {g.data_ptr() for g in replay.graphs.static_grads if g is not None}
    assert not static & {p.grad.data_ptr() for p in graphed.parameters()
                         if p.grad is not None}
    for (loss_g, grads_g), (loss_e, grads_e) in zip(got, want):
        torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=0)
        for g, e in zip(grads_g, grads_e):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3 * e.abs().max().item())


def _inference_models(family):
    """An eager model in eval mode and its twin with inference runners (at most 2
    graphs, captured on the first call): DinoVim with a dense model's four
    feature maps, or MLLA with its four stages."""
    if family == 'dinovim':
        eager = dinovim(64, 4, img_size=32, patch_size=8, drop_path_rate=0.2,
                        out_indices=[0, 1, 2, 3], mixer_cfg=dict(d_state=16, headdim=32))
    else:
        eager = tiny_mlla(out_indices=(0, 1, 2, 3))
    eager = eager.cuda().eval()
    graphed = copy.deepcopy(eager)
    assert gb.graph_blocks(graphed, training=False, max_signatures=2) == ['']
    return eager, graphed


@pytest.mark.gpu
@pytest.mark.parametrize('family', ['dinovim', 'mlla'])
def test_graphed_inference_equals_eager_across_sizes_and_an_eviction(family):
    """Test mode (eval, no grad), fp32 and fp16 autocast: three input sizes
    through a bound of 2 graphs (the third size frees the first one's graph, which
    is captured again when it returns); every output equals eager's exactly (the
    same kernels, replayed)."""
    eager, graphed = _inference_models(family)
    sizes = [(32, 32), (48, 64), (32, 32), (64, 32), (32, 32), (48, 64)]
    runners = (graphed.stack_runner.graphs, ) if family == 'dinovim' else \
        tuple(graphed.stage_runner.graphs)
    for dtype in (None, torch.float16):
        for h, w in sizes:
            x = torch.randn(2, 3, h, w, device='cuda')
            with torch.no_grad(), torch.autocast('cuda', dtype=dtype or torch.float16,
                                                 enabled=dtype is not None):
                got, want = graphed(x), eager(x)
            assert len(got) == len(want) == 4
            for g, e in zip(got, want):
                torch.testing.assert_close(g, e, rtol=0, atol=0)
    for blocks in runners:
        assert len(blocks._graphs) == 2 and blocks.evictions > 0


@pytest.mark.gpu
def test_an_evicted_graph_hands_its_memory_back():
    """A graph of a large input, freed by a capture of a small one (bound 1), takes
    its pool with it: what stays reserved is about the small graph's. (The large
    graph's static outputs alone, 8 of (64, 1025, 64) float32, take 128 MiB.)"""
    import gc
    eager, graphed = _inference_models('dinovim')
    gb.graph_blocks(graphed, training=False, max_signatures=1)
    del eager
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    with torch.no_grad():
        graphed(torch.randn(64, 3, 256, 256, device='cuda'))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        large = torch.cuda.memory_reserved() - base
        graphed(torch.randn(1, 3, 32, 32, device='cuda'))  # frees the large one
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    small = torch.cuda.memory_reserved() - base
    assert large > 96 * 2**20  # the large pool is worth measuring
    assert small < large / 8, (small, large)
    assert graphed.stack_runner.graphs.evictions == 1


@pytest.mark.gpu
def test_the_hook_graphs_a_cuda_model_for_testing():
    """``before_test`` on a CUDA model: inference runners, whose replays (after
    the second call of a size) equal eager's."""
    from mmdinomamba.engine.hooks import CUDAGraphBlocksHook
    eager = tiny(layers=3).cuda().eval()
    model = copy.deepcopy(eager)
    logs = []
    runner = type('R', (), dict(model=model, logger=type('L', (), {
        'info': lambda s, msg: logs.append(msg)})()))()
    CUDAGraphBlocksHook().before_test(runner)
    assert isinstance(model.stack_runner, gb.GraphedStack)
    x = torch.randn(4, 3, 32, 32, device='cuda')
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x)[0], eager(x)[0], rtol=0, atol=0)
    assert len(model.stack_runner.graphs._graphs) == 1
