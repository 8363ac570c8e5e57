"""PlainMLLA: MLLA's block on a plain layout, its readout, outputs and the
per-layer API."""
import pytest
import torch

from mmdinomamba.models.backbones import MLLABlock, PlainMLLA
from tests.factories import PLAIN_MLLA_TINY, plain_mlla

ARCH = PLAIN_MLLA_TINY


def model(**kwargs):
    return plain_mlla(patch_size=4, drop_path_rate=0.0, **kwargs).eval()


def test_blocks_are_mllas_on_the_patch_grid():
    """Patches -> MLLABlocks on the (h, w) grid -> final norm; the 'cls_token'
    readout is the mean of the patch tokens."""
    net = model(out_indices=(0, 2), out_type='raw')
    assert all(type(b) is MLLABlock and b.design == 'sub' and b.cpe1 is not None
               and b.attn.rope and b.attn.lepe is not None for b in net.layers)
    x = torch.randn(2, 3, 20, 28)  # 5 x 7 patches
    tokens, hw = net.patch_embed(x)
    assert hw == (5, 7)
    first = net.layers[0](tokens, hw)
    last = net.norm(net.layers[2](net.layers[1](first, hw), hw))
    out0, out2 = net(x)
    torch.testing.assert_close(out0, first)
    torch.testing.assert_close(out2, last)
    net.out_type = 'cls_token'
    torch.testing.assert_close(net(x)[1], last.mean(dim=1))
    net.out_type = 'featmap'
    assert net(x)[1].shape == (2, 16, 5, 7)


def test_normed_feature_source_and_intermediates():
    net = model(out_indices=(0, 1), feature_source='normed')
    x = torch.randn(1, 3, 16, 16)
    inter = net.forward_intermediates(x, indices=[0, 1], mixer_inputs=True)
    layout = inter.layout_of(1)
    assert layout.readout_type == 'mean' and layout.hw == (4, 4)
    assert len(layout.readout) == len(layout.patches) == 16
    assert inter.mixer_inputs[1].shape == (1, 16, 16)
    normed = net(x)
    torch.testing.assert_close(normed[1], net.norm(inter.features[1]).mean(dim=1))


def test_freezing_and_layer_decay():
    net = model(frozen_stages=2)
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert any(n.startswith('patch_embed') for n in frozen)
    assert all(n.startswith(('patch_embed', 'layers.0.', 'layers.1.')) for n in frozen)
    assert net.get_layer_depth('backbone.layers.2.attn.qk.weight', 'backbone.') == (3, 5)
    assert net.get_layer_depth('backbone.patch_embed.proj.weight', 'backbone.') == (0, 5)
    assert net.get_layer_depth('backbone.norm.weight', 'backbone.') == (4, 5)


def test_blocks_need_the_grid_of_their_tokens():
    net = model()
    with pytest.raises(ValueError, match='pass hw='):
        net.forward_tokens(torch.randn(1, 10, 16), [0])
    with pytest.raises(ValueError, match='do not fill the grid'):
        net.forward_tokens(torch.randn(1, 10, 16), [0], hw=(3, 4))
    with pytest.raises(ValueError, match="unknown feature_source 'mixer'"):
        PlainMLLA(arch=ARCH, feature_source='mixer')


def test_parameter_count_is_mllas_block_times_depth():
    """d192, 12 blocks, patch 8: the comparison recipe's MLLA-style entry."""
    net = PlainMLLA(arch='tiny', patch_size=8)
    c = 192
    block = (2 * 10 * c  # two CPE convs (3x3 depthwise + bias)
             + 2 * 2 * c  # two LayerNorms
             + 2 * (c * c + c) + 10 * c  # in_proj, act_proj, dwc
             + 2 * c * c + 2 * c + 10 * c  # qk, LePE
             + c * c + c  # out_proj
             + 4 * c * c + 4 * c + 4 * c * c + c)  # MLP
    want = 3 * 64 * c + c + 12 * block + 2 * c
    assert sum(p.numel() for p in net.parameters()) == want


def test_no_state_between_embed_and_blocks():
    """The grid goes from embed() to forward_tokens() as an argument: embedding a
    second image of another grid in between changes nothing, and the model holds
    no attribute that says which grid it last saw."""
    net = model(out_indices=(1, ), out_type='raw')
    a, b = torch.randn(1, 3, 16, 24), torch.randn(1, 3, 24, 16)
    tokens_a, layout_a = net.embed(a)
    net.embed(b)
    got = net.forward_tokens(tokens_a, [1], hw=layout_a.hw)[0]
    torch.testing.assert_close(got, net(a)[0], rtol=0, atol=0)
    before = dict(vars(net))
    net(b)
    assert dict(vars(net)).keys() == before.keys() and all(
        vars(net)[k] is v for k, v in before.items() if k != '_consumer_checked')
