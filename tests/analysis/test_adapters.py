"""The per-layer model API: ``forward_intermediates`` (our backbones and the
mmpretrain ViT adapter) against the backbones' own ``forward``, and the mixers'
mixing-matrix protocol against the modules' own outputs."""
import pytest
import torch
from mmpretrain.models.backbones import VisionTransformer

from mmdinomamba.analysis.adapters import (MMPretrainAttention, MMPretrainViT,
                                           as_backbone, as_mixer)
from mmdinomamba.models import DinoVim, LinearViT
from mmdinomamba.models.mixers import MixerInfo, TokenMixer

IMAGE = (32, 48)  # a 4 x 6 grid of 8 px patches


def build(kind, **kwargs):
    torch.manual_seed(0)
    if kind.startswith('dinovim'):
        model = DinoVim(arch=dict(embed_dims=32, num_layers=3), img_size=32,
                        patch_size=8, mixer_cfg=dict(d_state=8, headdim=8),
                        num_registers=3 if kind == 'dinovim-reg' else 0,
                        drop_path_rate=0.0, **kwargs)
    elif kind == 'linearvit':
        model = LinearViT(arch=dict(embed_dims=32, num_layers=3, num_heads=2,
                                    mlp_ratio=2), img_size=32, patch_size=8,
                          drop_path_rate=0.0, **kwargs)
    else:
        model = VisionTransformer(arch=dict(embed_dims=32, num_layers=3, num_heads=2,
                                            feedforward_channels=64), img_size=32,
                                  patch_size=8, **kwargs)
        torch.nn.init.normal_(model.cls_token, std=0.5)
        torch.nn.init.normal_(model.pos_embed, std=0.5)
    model.eval()
    return model


def images():
    return torch.randn(2, 3, *IMAGE, generator=torch.Generator().manual_seed(0))


KINDS = ['dinovim', 'dinovim-reg', 'linearvit', 'vit']


@pytest.mark.parametrize('kind', KINDS)
def test_features_are_the_backbones_own_raw_outputs(kind):
    api = as_backbone(build(kind))
    assert isinstance(api, MMPretrainViT) == (kind == 'vit')
    with torch.no_grad():
        out = api.forward_intermediates(images(), [-1, 0], mixer_inputs=True)
    assert sorted(out.features) == [0, 2] and sorted(out.mixer_inputs) == [0, 2]
    for i in (0, 2):
        with torch.no_grad():
            raw = build(kind, out_indices=[i], out_type='raw')(images())[0]
        torch.testing.assert_close(out.features[i], raw, rtol=0, atol=0)
    layout = out.layout
    assert layout.hw == (4, 6) and len(layout.patches) == 24
    seqlen = out.features[0].shape[1]
    positions = torch.cat([layout.readout, layout.patches])
    assert len(set(positions.tolist())) == len(positions) and positions.max() < seqlen
    assert layout.readout_type == ('registers' if kind == 'dinovim-reg' else 'cls')
    assert len(layout.readout) == (3 if kind == 'dinovim-reg' else 1)


@pytest.mark.parametrize('kind', KINDS)
def test_mixer_inputs_are_what_the_mixers_read(kind):
    model = build(kind)
    api = as_backbone(model)
    seen = {}
    handles = [api.token_mixer(i).register_forward_pre_hook(
        lambda m, args, i=i: seen.setdefault(i, args[0])) for i in range(3)]
    with torch.no_grad():
        model(images())
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        out = api.forward_intermediates(images(), 1, mixer_inputs=True)
    assert list(out.mixer_inputs) == [1]
    torch.testing.assert_close(out.mixer_inputs[1], seen[1], rtol=0, atol=0)
    # no hook is left behind, and without mixer_inputs none is captured
    assert all(not api.token_mixer(i)._forward_pre_hooks for i in range(3))
    with torch.no_grad():
        assert api.forward_intermediates(images(), [0]).mixer_inputs == {}


def test_forward_intermediates_stops_early_and_checks_options():
    model = build('dinovim')
    calls = []
    handle = model.layers[2].register_forward_pre_hook(lambda m, a: calls.append(1))
    with torch.no_grad():
        model.forward_intermediates(images(), [0, 1])
    assert calls == []
    handle.remove()
    with pytest.raises(ValueError, match=r"choose one of \('residual', 'normed', "
                       r"'mixer'\)"):
        model.forward_intermediates(images(), feature_source='stream')
    with pytest.raises(ValueError, match='out of range'):
        model.forward_intermediates(images(), [3])
    with pytest.raises(ValueError, match='no block indices'):
        model.forward_intermediates(images(), [])
    with pytest.raises(ValueError, match='final_norm=False'):
        as_backbone(build('vit', final_norm=False)).forward_intermediates(
            images(), feature_source='normed')
    with pytest.raises(ValueError, match='VisionTransformer'):
        as_backbone(torch.nn.Linear(2, 2))


def test_mixer_protocol():
    model = build('dinovim')
    mixer = model.token_mixer(0)
    assert isinstance(mixer, TokenMixer) and as_mixer(mixer) is mixer
    assert mixer.mixing_info() == MixerInfo('ssd', 8, 8, ('forward', 'backward'))
    attn = build('linearvit').token_mixer(0)
    assert attn.mixing_info() == MixerInfo('linear', 2, 16, ('attention', ))
    mha = as_mixer(as_backbone(build('vit')).token_mixer(0))
    assert isinstance(mha, MMPretrainAttention)
    assert mha.mixing_info() == MixerInfo('softmax', 2, 16, ('attention', ))
    with pytest.raises(ValueError, match='not a known token mixer'):
        as_mixer(torch.nn.Linear(2, 2))
    # the SSD mixer's matrices act on its values: M_d x_d = the pre-norm output
    u = torch.randn(1, 7, 32, dtype=torch.float64)
    mixer = mixer.double()
    mats, values, masks = mixer.mixing_matrices(u), mixer.mixing_values(u), \
        mixer.decay_masks(u)
    seen = {}
    handles = [getattr(mixer, n).register_forward_pre_hook(
        lambda m, a, d=d: seen.setdefault(d, a[0]))
        for d, n in (('forward', 'norm'), ('backward', 'norm_b'))]
    with torch.no_grad():
        mixer(u)
    for handle in handles:
        handle.remove()
    for d in ('forward', 'backward'):
        y = torch.einsum('bhij,bhjp->bhip', mats[d], values[d])
        expected = seen[d].flip(1) if d == 'backward' else seen[d]
        torch.testing.assert_close(y.permute(0, 2, 1, 3).reshape(1, 7, -1), expected,
                                   rtol=1e-11, atol=1e-11)
    assert torch.equal(masks['forward'], masks['forward'].tril())
    assert torch.equal(masks['backward'], masks['backward'].triu())
