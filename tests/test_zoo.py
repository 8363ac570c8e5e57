"""mmdinomamba.zoo: one set of backbone names, and the shipped configs found from
the package."""
import os.path as osp

import pytest

from mmdinomamba import zoo

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_every_alias_and_case_gives_the_canonical_name():
    assert zoo.canonical_name('dinovim-t') == 'dinovim-tiny'
    assert zoo.canonical_name('DinoVim-Tiny') == 'dinovim-tiny'
    assert zoo.canonical_name('reg-b') == 'dinomamba-reg-base'
    assert zoo.canonical_name('dinovim-b-p16') == 'dinovim-base-p16'
    for name, (_, aliases, _) in zoo.BACKBONES.items():
        assert zoo.canonical_name(name) == name
        assert all(zoo.canonical_name(a.upper()) == name for a in aliases)
    # aliases are unique and never shadow a canonical name
    assert not set(zoo.ALIASES) & set(zoo.BACKBONES)
    assert len(zoo.ALIASES) == sum(len(a) for _, a, _ in zoo.BACKBONES.values())


def test_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match=r"'dinovim-huge'.*dinovim-tiny \(dinovim-t\)"):
        zoo.canonical_name('dinovim-huge')


def test_backbone_config_is_a_copy():
    cfg = zoo.backbone_config('dinovim-s')
    assert cfg == dict(type='DinoVim', arch='small')
    cfg['arch'] = 'base'
    assert zoo.backbone_config('dinovim-small')['arch'] == 'small'


def test_configs_and_index_of_a_checkout_are_the_repository_s():
    assert osp.samefile(zoo.package_root(), REPO)
    assert osp.samefile(zoo.config_path('robustness'), osp.join(REPO, 'configs',
                                                                 'robustness'))
    assert osp.samefile(zoo.model_index_path(), osp.join(REPO, 'model-index.yml'))
