"""Activation maps against explicit per-pixel loops and the modules' own forward.

Words -> letters of the module docstring: readout = r, patch token j = p_j,
heads = H, head map g = map_g.
"""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.analysis import (activation_maps, cosine_similarity_maps,
                                  layer_activation_maps, layer_tokens, token_layout,
                                  upsample_maps)
from tests.factories import dinovim, linear_vit, mmpretrain_vit

# Non-square images with a 6 x 8 patch grid: rows and columns cannot be swapped
# without a test noticing.
IMAGE = (48, 64)
PATCH = 8


def tiny(kind, **kwargs):
    if kind in ('dinovim', 'dinovim-reg'):
        model = dinovim(64, 2, img_size=64, patch_size=PATCH,
                        mixer_cfg=dict(d_state=16, headdim=16, chunk_size=16),
                        num_registers=4 if kind == 'dinovim-reg' else 0,
                        drop_path_rate=0.0, **kwargs)
    elif kind == 'linearvit':
        model = linear_vit(64, 2, num_heads=4, img_size=64, patch_size=PATCH,
                           drop_path_rate=0.0, **kwargs)
    else:
        model = mmpretrain_vit(64, 2, num_heads=4, feedforward_channels=128,
                               img_size=64, patch_size=PATCH, **kwargs)
        # zero-initialised until init_weights (which logs every parameter)
        torch.nn.init.normal_(model.cls_token, std=0.5)
        torch.nn.init.normal_(model.pos_embed, std=0.5)
    model.eval()  # mmpretrain's ViT.train returns None
    return model


def images(batch=2, dtype=torch.float32):
    return torch.randn(batch, 3, *IMAGE, generator=torch.Generator().manual_seed(1),
                       dtype=dtype)


KINDS = ['dinovim', 'dinovim-reg', 'linearvit', 'vit']
HEADS = {'dinovim': 8, 'dinovim-reg': 8, 'linearvit': 4, 'vit': 4}  # 2*64/16, 4, 4


def raw_tokens(kind, layer):
    """Tokens after ``layer`` through the backbone's own forward (out_type='raw')."""
    model = tiny(kind, out_indices=[layer], out_type='raw').double()
    with torch.no_grad():
        return model(images(dtype=torch.float64))[0], model


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('layer', [0, -1])
def test_cosine_maps_equal_a_per_pixel_loop(kind, layer):
    tokens, model = raw_tokens(kind, layer)
    layout = token_layout(model, images(dtype=torch.float64))
    grid = (IMAGE[0] // PATCH, IMAGE[1] // PATCH)
    assert layout.hw == grid
    maps = activation_maps(model, images(dtype=torch.float64), layer=layer,
                           upsample=False)
    num_heads = HEADS[kind]
    assert maps.heads.shape == (2, num_heads, *grid)
    width = tokens.shape[-1] // num_heads
    for b in range(2):
        # the readout: [CLS], or the mean of the registers
        r = tokens[b, layout.readout].mean(0)
        for g in range(num_heads):
            ch = slice(g * width, (g + 1) * width)
            for i in range(grid[0]):
                for j in range(grid[1]):
                    p = tokens[b, layout.patches[i * grid[1] + j]]
                    expected = float(r[ch] @ p[ch] / (r[ch].norm() * p[ch].norm()))
                    # float64 throughout: only rounding differs (~1e-16)
                    assert maps.heads[b, g, i, j].item() == pytest.approx(
                        expected, abs=1e-12)


def test_register_readout_is_the_register_mean():
    model = tiny('dinovim-reg')
    layout = token_layout(model, images())
    assert len(layout.readout) == 4
    tokens, _ = layer_tokens(model, images(), [-1])
    mean_readout = tokens[1][:, layout.readout].mean(1)
    # the backbone's own 'cls_token' output is the same register mean
    torch.testing.assert_close(tiny('dinovim-reg')(images())[0], mean_readout)


@pytest.mark.parametrize('kind', KINDS)
def test_mean_and_upsampling(kind):
    model = tiny(kind)
    grid = activation_maps(model, images(), upsample=False)
    full = activation_maps(model, images())
    assert full.heads.shape == (2, HEADS[kind], *IMAGE)
    assert full.mean.shape == (2, *IMAGE)
    # the documented mean: the average of the head maps, on the grid and upsampled
    torch.testing.assert_close(grid.mean, grid.heads.mean(1), rtol=0, atol=0)
    torch.testing.assert_close(full.mean, full.heads.mean(1), rtol=0, atol=0)
    # bilinear upsampling is linear: upsample(mean) = mean(upsample); float32
    # sums of 4-8 terms in another order differ by a few ulps
    torch.testing.assert_close(full.heads, F.interpolate(
        grid.heads, size=IMAGE, mode='bilinear', align_corners=False))
    torch.testing.assert_close(full.mean, upsample_maps(grid.mean[:, None], IMAGE)[:, 0],
                               rtol=0, atol=1e-6)
    # one head = the cosine over all channels
    tokens, layout = layer_tokens(model, images(), [-1])
    t = tokens[max(tokens)]
    whole = F.cosine_similarity(t[:, layout.readout].mean(1)[:, None],
                                t[:, layout.patches], dim=-1)
    one = activation_maps(model, images(), num_heads=1, upsample=False)
    torch.testing.assert_close(one.heads.flatten(1), whole, rtol=0, atol=1e-6)


def test_layer_sweep_matches_single_layers():
    model = tiny('dinovim')
    sweep = layer_activation_maps(model, images())
    assert sorted(sweep) == [0, 1]
    for layer in (0, 1):
        single = activation_maps(model, images(), layer=layer)
        torch.testing.assert_close(sweep[layer].heads, single.heads, rtol=0, atol=0)


def test_vit_feature_sources():
    model = tiny('vit')
    tokens, _ = layer_tokens(model, images(), [0, 1])
    raw0 = tiny('vit', out_indices=[0], out_type='raw')(images())[0]
    raw1 = tiny('vit', out_indices=[1], out_type='raw')(images())[0]
    # 'residual': what the backbone returns (final LayerNorm on the last block only)
    torch.testing.assert_close(tokens[0], raw0, rtol=0, atol=0)
    torch.testing.assert_close(tokens[1], raw1, rtol=0, atol=0)
    normed, _ = layer_tokens(model, images(), [0], feature_source='normed')
    torch.testing.assert_close(normed[0], model.ln1(raw0), rtol=0, atol=0)
    with pytest.raises(ValueError, match='final_norm=False'):
        layer_tokens(tiny('vit', final_norm=False), images(), [0], 'normed')


@pytest.mark.parametrize('kind', ['vit', 'linearvit'])
def test_attention_row_reproduces_the_attention_output(kind):
    """sum_j a_j v_j through ``proj`` must give the module's own [CLS] output.

    The map holds the patch entries of the [CLS] query row; the row sums to 1,
    so the weight on [CLS] itself is 1 - sum(map). Any other logit scale or
    normalisation changes the reconstructed output.
    """
    model = tiny(kind)
    attn = model.layers[-1].attn
    seen = {}
    handle = attn.register_forward_hook(
        lambda module, args, out: seen.update(u=args[0], out=out))
    model(images())
    handle.remove()
    maps = activation_maps(model, images(), method='attention', upsample=False)
    a = maps.heads.flatten(2)  # (batch, heads, h * w)
    assert (a >= 0).all()
    self_weight = 1 - a.sum(-1)  # (batch, heads)
    assert (self_weight > 0).all() and (self_weight < 1).all()
    v = attn.qkv(seen['u']).unflatten(-1, (3, attn.num_heads, -1))[:, :, 2]
    v = v.transpose(1, 2)  # (batch, heads, seqlen, head_dims); [CLS] at 0
    mixed = self_weight[..., None] * v[:, :, 0] + torch.einsum('bgn,bgnc->bgc', a,
                                                               v[:, :, 1:])
    expected = seen['out'][:, 0]
    # float32 softmax and sums of 49 terms: agreement to ~1e-6 relative
    torch.testing.assert_close(attn.proj(mixed.flatten(1)), expected, rtol=1e-4,
                               atol=1e-5)
    assert maps.heads.shape == (2, HEADS[kind], 6, 8)
    full = activation_maps(model, images(), method='attention')
    assert full.heads.shape == (2, HEADS[kind], *IMAGE)


@pytest.mark.parametrize('kind', ['dinovim', 'dinovim-reg'])
def test_ssd_attention_map_is_the_readout_row_of_the_combined_matrix(kind):
    """Per pixel: the mean over readout tokens r of (M_f + M_b)[r, p_ij] / 2."""
    from mmdinomamba.analysis import mixing_matrices
    model = tiny(kind).double()
    x = images(dtype=torch.float64)
    mixer = model.token_mixer(1)
    seen = {}
    handle = mixer.register_forward_hook(lambda m, args, out: seen.update(u=args[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    mats = mixing_matrices(mixer, seen['u'])
    layout = token_layout(model, x)
    maps = activation_maps(model, x, method='attention', upsample=False)
    grid = (IMAGE[0] // PATCH, IMAGE[1] // PATCH)
    assert maps.heads.shape == (2, HEADS[kind], *grid)
    for b in range(2):
        for g in range(HEADS[kind]):
            for i in range(grid[0]):
                for j in range(grid[1]):
                    p = layout.patches[i * grid[1] + j]
                    f, bw = mats['forward'][b, g], mats['backward'][b, g]
                    entries = [(f[r, p] + bw[r, p]) / 2 for r in layout.readout]
                    expected = float(sum(entries) / len(entries))
                    assert maps.heads[b, g, i, j].item() == pytest.approx(
                        expected, rel=1e-9, abs=1e-12)
    # signed: the SSD row is not a probability distribution
    assert (maps.heads < 0).any() and (maps.heads > 0).any()


def test_bad_inputs_raise():
    vim = tiny('dinovim')
    bad = images()
    bad[0, 0, 0, 0] = float('nan')
    cases = [
        (lambda: activation_maps(vim, bad), 'NaN'),
        (lambda: activation_maps(vim, images()[0]), r'\(batch, channels'),
        (lambda: activation_maps(vim, images(), method='gradcam'), 'cosine'),
        (lambda: activation_maps(vim, images(), layer=2), 'out of range'),
        (lambda: activation_maps(vim, images(), num_heads=3), 'num_heads'),
        (lambda: activation_maps(vim, images(), feature_source='stream'), 'mixer'),
        (lambda: activation_maps(tiny('vit'), images(), method='attention',
                                 num_heads=2), 'must be None'),
        (lambda: activation_maps(torch.nn.Linear(3, 3), images()), 'DinoVim'),
        (lambda: cosine_similarity_maps(torch.ones(2, 8), torch.ones(2, 5, 8), (2, 3)),
         'grid'),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
