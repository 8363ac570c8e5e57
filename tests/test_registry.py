"""Registration into the downstream registries, and the torch-only core."""
import subprocess
import sys

import pytest

import mmdinomamba
from mmdinomamba.registry import REGISTRATIONS

PACKAGES = ['mmpretrain', 'mmseg', 'mmdet']


@pytest.mark.parametrize('package', PACKAGES)
@pytest.mark.parametrize('name', ['SSDMixer', 'DinoVim', 'LinearViT', 'MLLA',
                                  'PlainMLLA', 'LinearAttentionMixer'])
def test_models_registered_everywhere(package, name):
    registry = __import__(f'{package}.registry', fromlist=['MODELS']).MODELS
    cls = registry.get(name)
    assert cls is getattr(mmdinomamba.models, name)


@pytest.mark.parametrize('package', PACKAGES)
def test_build_from_config_dict(package):
    registry = __import__(f'{package}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=1),
                                mixer_cfg=dict(d_state=8, headdim=8)))
    assert type(model).__name__ == 'DinoVim'


def test_dino_is_not_registered_in_mmdet():
    from mmdet.registry import MODELS
    dino = MODELS.get('DINO')
    assert dino is None or not dino.__module__.startswith('mmdinomamba')


def test_registration_is_idempotent():
    assert mmdinomamba.register_all_modules() == []


def test_every_row_names_an_importable_class():
    from mmdinomamba.registry import _import_object
    for path, registry, packages in REGISTRATIONS:
        assert isinstance(_import_object(path), type), path
        assert set(packages) <= set(PACKAGES), path


@pytest.mark.slow
def test_custom_imports_in_a_config(tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("custom_imports = dict(imports=['mmdinomamba'], "
                   "allow_failed_imports=False)\n"
                   "model = dict(type='DinoVim', arch='small')\n")
    code = ("from mmengine.config import Config; from mmpretrain.registry import MODELS;"
            f"c = Config.fromfile({str(cfg)!r}); print(MODELS.get(c.model['type']))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout
    assert 'DinoVim' in out


CORE_ONLY = """
import builtins, sys
real_import = builtins.__import__
BLOCKED = ('mmcv', 'mmpretrain', 'mmseg', 'mmdet', 'torchvision', 'timm')
def guarded(name, *args, **kwargs):
    if name.split('.')[0] in BLOCKED:
        raise ImportError(f'blocked: {name}', name=name)
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
import torch
import mmdinomamba.ops, mmdinomamba.models.mixers, mmdinomamba.models.backbones
from mmdinomamba.models import DinoVim, SSDMixer
m = SSDMixer(16, d_state=4, headdim=8)
y = m(torch.randn(1, 5, 16))
b = DinoVim(arch=dict(embed_dims=32, num_layers=1), mixer_cfg=dict(d_state=8, headdim=8))
print(tuple(y.shape), tuple(b(torch.randn(1, 3, 32, 32))[0].shape))
import mmdinomamba
print('registered', mmdinomamba.register_all_modules())
"""


@pytest.mark.slow
def test_core_imports_with_torch_einops_mmengine_only():
    """The numerical core never imports mmcv / mmpretrain / mmseg / mmdet."""
    out = subprocess.run([sys.executable, '-c', CORE_ONLY], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert '(1, 5, 16) (1, 32)' in out.stdout
    assert 'registered []' in out.stdout
