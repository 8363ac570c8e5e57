"""DinoVim under torch.compile: one graph (no graph break, no recompile per block,
drop path on) and the same forward and gradients as eager."""
import pytest
import torch

from mmdinomamba.models.backbones import DinoVim


def tiny(drop_path_rate=0.0):
    torch.manual_seed(0)
    return DinoVim(arch=dict(embed_dims=32, num_layers=3), img_size=32, patch_size=8,
                   drop_path_rate=drop_path_rate,
                   mixer_cfg=dict(d_state=8, headdim=16, chunk_size=16))


def test_no_graph_break_and_one_graph_with_drop_path():
    torch._dynamo.reset()
    model = tiny(drop_path_rate=0.2).train()  # every block has its own rate
    explanation = torch._dynamo.explain(model)(torch.randn(2, 3, 32, 32))
    assert explanation.graph_break_count == 0, [
        str(b.reason)[:200] for b in explanation.break_reasons]
    assert explanation.graph_count == 1


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_compiled_cuda_takes_the_traceable_path_and_matches_the_fused_kernels():
    torch._dynamo.reset()
    model = tiny().cuda().train()
    x = torch.randn(2, 3, 32, 32, device='cuda')
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x)[0], model(x)[0], rtol=1e-4, atol=1e-5)
