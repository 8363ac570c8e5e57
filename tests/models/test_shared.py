"""What the models share: models/utils.py's helpers and the Backbone base that
MLLA and the plain backbones build on."""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models import MLLA, DinoVim, LinearViT, PlainMLLA
from mmdinomamba.models.backbones import Backbone, PlainBackbone
from mmdinomamba.models.utils import Mlp, init_dt_bias
from tests.factories import mlla, mlla_arch, plain_mlla


def test_init_dt_bias_softplus_is_log_uniform_and_floored():
    """softplus(bias) lies in [dt_min, dt_max], spread over it on a log scale
    (its log's mean is the interval's log-midpoint), and the floor clamps it."""
    torch.manual_seed(0)
    dt = F.softplus(init_dt_bias(20000, 1e-3, 1e-1, 1e-4).double())
    assert dt.min() >= 1e-3 * (1 - 1e-6) and dt.max() <= 1e-1 * (1 + 1e-6)
    mid = (torch.tensor(1e-3).log() + torch.tensor(1e-1).log()).double() / 2
    assert abs(dt.log().mean() - mid) < 0.02  # sd of the mean: 4.6/sqrt(12*20000)
    floored = F.softplus(init_dt_bias(1000, 1e-3, 1e-1, 5e-2).double())
    assert floored.min() >= 5e-2 * (1 - 1e-6)
    assert init_dt_bias(4, 1e-3, 1e-1, 1e-4, dtype=torch.float64).dtype == torch.float64


def test_mlp_is_two_linears_around_a_gelu():
    torch.manual_seed(0)
    mlp = Mlp(6, 10)
    x = torch.randn(2, 3, 6)
    want = F.linear(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)), mlp.fc2.weight,
                    mlp.fc2.bias)
    torch.testing.assert_close(mlp(x), want, rtol=0, atol=0)


def test_every_backbone_shares_the_one_contract():
    """MLLA and the plain backbones take _parse_arch, the Pretrained load and the
    intermediate capture from Backbone: one definition each (DinoVim and
    LinearViT extend init_weights, through super, with their own init)."""
    def owner(cls, name):
        return next(c for c in cls.__mro__ if name in vars(c))

    shared = ('_parse_arch', 'init_weights', 'read_checkpoint_state',
              '_intermediate_indices', '_mixer_input_capture', 'train')
    for cls in (MLLA, PlainMLLA, DinoVim, LinearViT):
        assert issubclass(cls, Backbone)
        for name in shared:
            if name == 'init_weights' and cls in (DinoVim, LinearViT):
                continue
            if name == 'read_checkpoint_state' and cls is MLLA:
                continue  # reads official files and converts them
            assert owner(cls, name) is Backbone, (cls.__name__, name)
    assert not issubclass(MLLA, PlainBackbone)


@pytest.mark.parametrize('build', [mlla, plain_mlla])
def test_arch_and_intermediate_checks_read_the_same(build):
    name = build().__class__.__name__
    with pytest.raises(ValueError, match=f'{name}: unknown arch'):
        build(arch='huge')
    with pytest.raises(ValueError, match=rf"{name}: custom arch is missing \['mlp_ratio'\]"):
        build(arch={k: v for k, v in build().arch_settings.items() if k != 'mlp_ratio'})
    model = build().eval()
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match=f"{name}: unknown feature_source 'x'"):
        model.forward_intermediates(x, feature_source='x')
    with pytest.raises(ValueError, match=f'{name}.forward_intermediates: no block'):
        model.forward_intermediates(x, indices=[])
    inter = model.forward_intermediates(x, indices=[0, -1], mixer_inputs=True)
    assert sorted(inter.mixer_inputs) == sorted(inter.features) == [0, model.num_layers - 1]
    # the capture's hooks are gone afterwards
    assert all(not model.token_mixer(i)._forward_pre_hooks
               for i in range(model.num_layers))


def test_mlla_pretrained_checks_its_config_as_the_plain_ones(tmp_path):
    """MLLA's Pretrained entry goes through the same checks (unknown keys, strict
    a bool) before its own reading of the file."""
    path = str(tmp_path / 'w.pth')
    torch.save(mlla().state_dict(), path)
    for cfg, match in ((dict(checkpoint=path, strict='yes'), 'strict must be True or'),
                       (dict(checkpoint=path, prefx='a'), 'unknown keys'),
                       (dict(checkpoint=''), 'needs a `checkpoint`')):
        model = mlla(init_cfg=dict(type='Pretrained', **cfg))
        with pytest.raises(ValueError, match=f'MLLA init_cfg Pretrained.*{match}'):
            model.init_weights()
    model = mlla(seed=1, init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    assert all(torch.equal(v, mlla().state_dict()[k])
               for k, v in model.state_dict().items())
    assert mlla_arch()['depths'] is not mlla_arch()['depths']  # fresh copies
