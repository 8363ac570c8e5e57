"""The residual add + LayerNorm kernels (mmdinomamba.ops.triton.layer_norm) on a CUDA
device: against their twin in float64 at the widths MLLA uses (64 to 1024 in its
blocks, 4C = 2048 in Swin's patch merging of MLLA-B, and widths that are no power of
two), under bf16 autocast against ``F.layer_norm`` in float32, and in MLLA's block
against the PyTorch path.

Bounds: the kernels compute in float32 with no matmul, so against float64 the
error is float32 rounding, far below FP32_TOL = 1e-5. An output rounded once to
bf16 (to nearest: at most 2^-9 relative per entry) is held to BF16_TOL = 2^-8 in
norm. The block's matmuls run in bf16 under autocast, and there the fused and the
PyTorch paths differ by the bf16 rounding of the normalised rows amplified through
the block: 2e-2, as in test_mlla_triton_cuda.py.
"""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.backbones.mlla import MLLABlock
from mmdinomamba.models.mixers import AddLayerNorm
from mmdinomamba.ops import add_layer_norm, add_layer_norm_ref, backend

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures('no_tf32')]

FP32_TOL = 1e-5
BF16_TOL = 2**-8
BLOCK_TOL = 2e-2


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _grads(fn, ins, dout, dres):
    res, out = fn(*ins)
    loss = (out * dout.to(out.dtype)).sum() + (res * dres.to(res.dtype)).sum()
    return [res, out, *torch.autograd.grad(loss, ins)]


@pytest.mark.parametrize('dim', [64, 96, 128, 320, 512, 1024, 2048])
def test_kernel_is_its_twin(dim):
    """Float32 through the dispatcher (the kernel on CUDA) against the twin in
    float64: the residual, the norm and the gradients of x, h, weight and bias; 4099
    rows (no multiple of any tile)."""
    torch.manual_seed(0)
    assert backend.use_triton(torch.zeros(1, device='cuda'))
    x = torch.randn(4099, dim, device='cuda') + 2.
    h, dout, dres = (torch.randn(4099, dim, device='cuda') for _ in range(3))
    w, b = 1 + 0.5 * torch.randn(dim, device='cuda'), torch.randn(dim, device='cuda')
    ins = [t.requires_grad_(True) for t in (x, h, w, b)]
    got = _grads(lambda *a: add_layer_norm(*a, 1e-5), ins, dout, dres)
    ins64 = [t.detach().double().requires_grad_(True) for t in ins]
    want = _grads(lambda *a: add_layer_norm_ref(*a, 1e-5), ins64, dout.double(),
                  dres.double())
    errors = {n: rel(g, r) for n, g, r in zip(
        ('res', 'out', 'dx', 'dh', 'dw', 'db'), got, want)}
    assert max(errors.values()) < FP32_TOL, errors
    with torch.no_grad():  # the inference path (a kernel without the statistics)
        res, out = add_layer_norm(x, h, w, b, 1e-5)
    assert torch.equal(res, got[0]) and rel(out, got[1]) < FP32_TOL


def test_autocast_against_fp32_layer_norm():
    """MLLA's case under bf16 autocast: a float32 stream x plus a bf16 branch h
    (CPE's conv output). The module returns the residual in float32 and the norm in
    bf16, against ``x + h`` and ``F.layer_norm`` in float32 without autocast; the
    gradients (from a bf16 output gradient, as the next Linear gives) against
    autograd's through the float32 ops."""
    torch.manual_seed(0)
    norm = AddLayerNorm(96).cuda()
    with torch.no_grad():
        norm.weight.normal_(1, 0.5)
        norm.bias.normal_()
    x = (torch.randn(8, 196, 96, device='cuda') + 1.).requires_grad_(True)
    h = torch.randn(8, 196, 96, device='cuda').bfloat16().requires_grad_(True)
    dout = torch.randn(8, 196, 96, device='cuda').bfloat16()
    dres = torch.randn(8, 196, 96, device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        res, out = norm(x, h)
    assert res.dtype == torch.float32 and out.dtype == torch.bfloat16
    params = [x, h, norm.weight, norm.bias]
    got = torch.autograd.grad((out * dout).sum() + (res * dres).sum(), params)
    res32 = x + h.float()
    out32 = F.layer_norm(res32, (96, ), norm.weight, norm.bias, norm.eps)
    want = torch.autograd.grad((out32 * dout.float()).sum() + (res32 * dres).sum(),
                               params)
    assert torch.equal(res, res32)
    assert rel(out, out32) < BF16_TOL
    assert got[1].dtype == torch.bfloat16 and rel(got[1], want[1]) < BF16_TOL
    errors = {n: rel(g, r) for n, g, r in zip(('dx', 'dw', 'db'),
                                              (got[0], *got[2:]),
                                              (want[0], *want[2:]))}
    assert max(errors.values()) < FP32_TOL, errors


@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'bf16-autocast'])
def test_block_is_its_pytorch_path(amp, monkeypatch):
    """MLLA's block with its two fused add + norms against the same block whose
    norms take the PyTorch path (``nn.LayerNorm`` after the add); output and every
    gradient."""
    torch.manual_seed(0)
    block = MLLABlock(64, 2).cuda()
    for m in (block.norm1, block.norm2):
        with torch.no_grad():
            m.weight.normal_(1, 0.5)
            m.bias.normal_()
    x = torch.randn(4, 99, 64, device='cuda', requires_grad=True)
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(backend, 'use_triton', lambda t: False)
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp):
            y = block(x, (9, 11))
        runs.append([y, *torch.autograd.grad(y.float().square().sum(),
                                             [x, *block.parameters()])])
    tol = BLOCK_TOL if amp else 1e-4
    errors = [rel(a, b) for a, b in zip(*runs)]
    assert max(errors) < tol, errors
