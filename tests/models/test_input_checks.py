"""NaN and Inf are reported where they enter: the images, a mixer's input.

On the CPU (these tests) the checks always run; on CUDA only with
MMDINOMAMBA_CHECK_FINITE=1, as the SSD scan's own `dt` check.
"""
import pytest
import torch

from mmdinomamba.models.backbones import DinoVim, LinearViT
from mmdinomamba.models.mixers import LinearAttention, SSDMixer
from tests.factories import dinovim, linear_vit


def small(cls):
    if cls is DinoVim:
        return dinovim(img_size=32, patch_size=8,
                       mixer_cfg=dict(d_state=8, headdim=8, chunk_size=16)).eval()
    return linear_vit(img_size=32, patch_size=8).eval()


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
@pytest.mark.parametrize('cls', [DinoVim, LinearViT])
def test_backbone_names_nonfinite_images(cls, bad):
    model = small(cls)
    images = torch.randn(2, 3, 32, 32)
    assert torch.isfinite(model(images)[0]).all()
    images[1, 2, 5, 7] = bad
    with pytest.raises(ValueError, match=r'PatchEmbed: the batch of input images '
                       r'contains NaN or Inf values \(1 of 6144\)'):
        model(images)


@pytest.mark.parametrize('mixer, name', [
    (SSDMixer(32, d_state=8, headdim=8, chunk_size=16), 'SSDMixer'),
    (LinearAttention(32, 2), 'LinearAttention'),
])
def test_mixer_names_its_nonfinite_input(mixer, name):
    u = torch.randn(2, 10, 32)
    assert torch.isfinite(mixer(u)).all()
    u[0, 3, 1] = float('nan')
    with pytest.raises(ValueError, match=rf'{name}: the input contains NaN or Inf'):
        mixer(u)


def test_huge_dt_in_a_dinovim_stays_finite():
    """A_log >= 89 makes A = -inf in float32: the chunked scan gives zero decay,
    not NaN (which the next layer used to report as "dt contains NaN")."""
    model = small(DinoVim)
    for p in ('A_log', 'A_log_b'):
        getattr(model.layers[0].mixer, p).data.fill_(89.0)
    model.layers[0].mixer.ssd_backend = 'chunked'
    assert torch.isfinite(model(torch.randn(2, 3, 32, 32))[0]).all()


def test_ssd_mixer_names_an_empty_sequence():
    """No tokens: a clear error naming the sequence length, not the conv's size
    error from deeper down."""
    mixer = SSDMixer(32, d_state=8, headdim=8, chunk_size=16)
    assert mixer(torch.randn(2, 1, 32)).shape == (2, 1, 32)  # one token is enough
    with pytest.raises(ValueError, match=r'SSDMixer: the input has no tokens '
                       r'\(seqlen 0, shape \(2, 0, 32\)\)'):
        mixer(torch.randn(2, 0, 32))
