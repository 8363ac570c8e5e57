"""AddLayerNorm (the residual add + LayerNorm of MLLA's blocks) as a module: an
``nn.LayerNorm`` to its parameters, state dict and output, with the add fused in."""
import torch
from torch import nn

from mmdinomamba.models.mixers import AddLayerNorm


def test_is_a_layer_norm_with_its_parameters_and_output():
    torch.manual_seed(0)
    plain, fused = nn.LayerNorm(40, eps=1e-6), AddLayerNorm(40, eps=1e-6)
    nn.init.normal_(plain.weight)
    nn.init.normal_(plain.bias)
    fused.load_state_dict(plain.state_dict())  # strict: the same names and shapes
    assert isinstance(fused, nn.LayerNorm) and list(fused.state_dict()) == ['weight',
                                                                           'bias']
    x, h = torch.randn(2, 7, 40), torch.randn(2, 7, 40)
    assert torch.equal(fused(x), plain(x))  # without h: the LayerNorm alone
    res, out = fused(x, h)
    assert torch.equal(res, x + h) and torch.equal(out, plain(x + h))
    out.sum().backward()
    plain(x + h).sum().backward()
    assert torch.equal(fused.weight.grad, plain.weight.grad)
    assert torch.equal(fused.bias.grad, plain.bias.grad)
