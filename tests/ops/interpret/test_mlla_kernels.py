"""MLLA's kernels (mmdinomamba.ops.triton.mlla) on the CPU, through Triton's
interpreter, against their PyTorch twins in float64: the feature map with the
rotation, and the output with the normaliser and LePE; forward and gradients, with
and without each optional input. Bounds: :mod:`.checks`."""
import pytest
import torch

from mmdinomamba.models.mixers.positional import rope_2d_table
from mmdinomamba.ops.mlla import mlla_features, mlla_output_ref, rope_head_table
from mmdinomamba.ops.triton import mlla_features_triton, mlla_output_triton
from .checks import assert_close_all, rel

# A result rounded once to bfloat16, against the reference rounded to bfloat16 too:
# at most one unit apart (2^-7 relative; the interpreter's cast may round toward
# zero where the GPU's rounds to nearest)
BF16_ULP = 2**-7


@pytest.mark.parametrize('rope', [True, False], ids=['rope', 'no-rope'])
@pytest.mark.parametrize('hw,heads,width', [((5, 7), 2, 24), ((3, 3), 1, 8),
                                            ((4, 6), 4, 32)])
def test_features(rope, hw, heads, width):
    """A token count that is no multiple of the block, a width that is no power
    of two (24), one head; the gradient of both outputs."""
    torch.manual_seed(0)
    n = hw[0] * hw[1]
    qk = torch.randn(2, n, 2 * width, requires_grad=True)
    table = rope_head_table(*rope_2d_table(hw, width, dtype=torch.float64), heads) \
        if rope else None
    feat_ref, rot_ref = mlla_features(qk.double(), heads, table)
    dfeat, drot = torch.randn_like(feat_ref), torch.randn_like(rot_ref)
    loss_ref = (feat_ref * dfeat).sum() + (rot_ref * drot).sum()
    g_ref, = torch.autograd.grad(loss_ref, qk)
    table32 = None if table is None else tuple(t.float() for t in table)
    feat, rot = mlla_features_triton(qk, heads, table32)
    assert feat.shape == feat_ref.shape and feat.dtype == torch.float32
    loss = (feat * dfeat.float()).sum() + (rot * drot.float()).sum()
    g, = torch.autograd.grad(loss, qk)
    assert_close_all({'feat': rel(feat, feat_ref), 'rot': rel(rot, rot_ref),
                      'dqk': rel(g, g_ref)})
    # only one output used: the other's gradient is None
    g_one, = torch.autograd.grad((mlla_features_triton(qk, heads, table32)[0]
                                  * dfeat.float()).sum(), qk)
    g_one_ref, = torch.autograd.grad((mlla_features(qk.double(), heads, table)[0]
                                      * dfeat).sum(), qk)
    assert_close_all({'dqk(feat alone)': rel(g_one, g_one_ref)})


def test_features_half_precision_input():
    torch.manual_seed(0)
    qk = torch.randn(2, 12, 32).to(torch.bfloat16).requires_grad_(True)
    table = rope_head_table(*rope_2d_table((3, 4), 16), 2)
    feat, rot = mlla_features_triton(qk, 2, table)
    feat_ref, rot_ref = mlla_features(qk.double(), 2, tuple(t.double() for t in table))
    g, = torch.autograd.grad(rot.sum(), qk)
    g_ref, = torch.autograd.grad(rot_ref.sum(), qk)
    assert g.dtype == torch.bfloat16
    assert_close_all({'feat': rel(feat, feat_ref), 'rot': rel(rot, rot_ref)})
    assert_close_all({'dqk': rel(g, g_ref.to(torch.bfloat16))}, BF16_ULP)


@pytest.mark.parametrize('normalize', [True, False])
@pytest.mark.parametrize('lepe', [True, False])
def test_output(normalize, lepe):
    torch.manual_seed(0)
    batch, heads, n, e = 2, 3, 21, 5
    num = torch.randn(batch, heads, n, e, requires_grad=True)
    den = (torch.rand(batch, heads, n, 1) + 0.5).requires_grad_(True) if normalize \
        else None
    extra = torch.randn(batch, n, heads * e, requires_grad=True) if lepe else None
    const = n * 1e-6 if normalize else float(n)
    ins = [t for t in (num, den, extra) if t is not None]
    ref = mlla_output_ref(num.double(), None if den is None else den.double(),
                          None if extra is None else extra.double(), const,
                          torch.float64)
    dout = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * dout).sum(), ins)
    out = mlla_output_triton(num, den, extra, const, torch.float32)
    assert out.shape == (batch, n, heads * e) and out.is_contiguous()
    g = torch.autograd.grad((out * dout.float()).sum(), ins)
    errors = {'out': rel(out, ref)}
    names = [name for name, t in zip(('dnum', 'dden', 'dextra'), (num, den, extra))
             if t is not None]
    for name, a, b in zip(names, g, g_ref):
        errors[name] = rel(a, b)
    assert_close_all(errors)


def test_output_in_bfloat16_with_a_bfloat16_lepe():
    torch.manual_seed(0)
    num = torch.randn(1, 2, 9, 4)
    den = torch.rand(1, 2, 9, 1) + 0.5
    extra = torch.randn(1, 9, 8).to(torch.bfloat16).requires_grad_(True)
    out = mlla_output_triton(num, den, extra, 9e-6, torch.bfloat16)
    ref = mlla_output_ref(num.double(), den.double(), extra.double(), 9e-6,
                          torch.float64)
    assert out.dtype == torch.bfloat16
    assert_close_all({'out': rel(out, ref.to(torch.bfloat16))}, BF16_ULP)
    g, = torch.autograd.grad(out.float().sum(), extra)
    assert g.dtype == torch.bfloat16 and torch.equal(g, torch.ones_like(g))
