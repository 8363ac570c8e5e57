"""DinoVim under torch.compile: one graph (no graph break, no recompile per block,
drop path on) and the same forward and gradients as eager."""
import copy

import pytest
import torch

from mmdinomamba.engine.graphed_blocks import graph_blocks
from tests.factories import dinovim


def tiny(drop_path_rate=0.0):
    return dinovim(32, 3, img_size=32, patch_size=8, drop_path_rate=drop_path_rate,
                   mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16))


@pytest.mark.slow
def test_no_graph_break_and_one_graph_with_drop_path():
    torch._dynamo.reset()
    model = tiny(drop_path_rate=0.2).train()  # every block has its own rate
    graph_blocks(model)  # as the -compile configs: steps aside under compile
    explanation = torch._dynamo.explain(model)(torch.randn(2, 3, 32, 32))
    assert explanation.graph_break_count == 0, [
        str(b.reason)[:200] for b in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_compiled_equals_eager():
    """aot_eager traces forward and backward as the compiler does (Inductor's code
    generation aside): the same outputs and parameter gradients in float64."""
    torch._dynamo.reset()
    model = tiny().double().train()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    compiled = torch.compile(model, backend='aot_eager', fullgraph=True)
    out_c = compiled(x)[0]
    grads_c = torch.autograd.grad(out_c.sum(), list(model.parameters()))
    out_e = model(x)[0]
    grads_e = torch.autograd.grad(out_e.sum(), list(model.parameters()))
    torch.testing.assert_close(out_c, out_e, rtol=1e-12, atol=1e-12)
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge, rtol=1e-10, atol=1e-12)



@pytest.fixture
def no_tf32():
    """IEEE float32 matmuls and convolutions (cuDNN's default is TF32, whose 10-bit
    mantissa put the patch embedding 1e-3 off the float64 reference on an H200)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.gpu
@pytest.mark.parametrize('mode', ['default', 'reduce-overhead'])
def test_compiled_cuda_runs_the_fused_mixer_as_custom_ops_and_matches_eager(mode,
                                                                           no_tf32):
    """On CUDA the compiled graph holds the mixer's custom op (one node per block, no
    graph break, one graph with drop path on, the graphed blocks switched on), and
    the compiled model, CUDA graphs included, gives eager's outputs and gradients (the same mixer kernels; Inductor's
    own norms and matmuls: float32 rounding apart)."""
    torch._dynamo.reset()
    model = tiny(drop_path_rate=0.0).cuda().train()
    # as the -compile configs (CUDAGraphBlocksHook and CompileModulesHook): the
    # graphed blocks step aside under compile; eager calls replay them
    graph_blocks(model)
    x = torch.randn(2, 3, 32, 32, device='cuda')
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    targets = [str(n.target) for g in explanation.graphs for n in g.graph.nodes]
    assert sum('mmdinomamba.mixer_core_fwd' in t for t in targets) == 3  # 3 blocks
    torch._dynamo.reset()
    params = list(model.parameters())
    compiled = torch.compile(model, mode=mode, dynamic=False, fullgraph=True)
    for _ in range(3):  # CUDA graphs are recorded on a later call than the first
        out_c = compiled(x)[0]
        grads_c = torch.autograd.grad(out_c.pow(2).sum(), params)
        got_c = [t.clone() for t in (out_c, *grads_c)]
    out_e = model(x)[0]
    got_e = [out_e, *torch.autograd.grad(out_e.pow(2).sum(), params)]
    # the truth: the PyTorch path in float64, on the CPU; and the same path in
    # float32, whose own distance from it is what float32 can do for this model
    # (its gradients are sums that cancel: about 1e-3 norm-relative for the class
    # token's, whichever path computes them)
    got_r, got_32 = (_cpu_grads(model, x, dtype) for dtype in (torch.float64,
                                                               torch.float32))
    names = ['out'] + [n for n, _ in model.named_parameters()]
    for name, c, e, r, f in zip(names, got_c, got_e, got_r, got_32):
        # eager fused and compiled (Inductor's own norms and matmuls) within 10x the
        # float32 reference's error: float32 rounding in other orders; a wrong term
        # gives an O(1) error
        bound = 10 * rel_err(f, r) + 1e-5
        assert rel_err(e, r) < bound, (name, rel_err(e, r), bound)
        assert rel_err(c, r) < bound, (name, rel_err(c, r), bound)


def _cpu_grads(model, x, dtype):
    """Output and parameter gradients of a CPU copy of ``model`` (the PyTorch path)
    in ``dtype``."""
    ref = copy.deepcopy(model).cpu().to(dtype)
    out = ref(x.cpu().to(dtype))[0]
    return [out, *torch.autograd.grad(out.pow(2).sum(), list(ref.parameters()))]


def rel_err(a, b):
    return ((a.cpu().double() - b).norm() / b.norm().clamp_min(1e-30)).item()
