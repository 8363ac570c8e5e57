"""Config values of the wrong type fail where they are given, naming the key, the type
wanted and the value (mmdinomamba/utils/arg_types.py, the backbones' and mixers'
``__init__``, and :func:`mmdinomamba.engine.check_config_types` before a run).

As found: ``patch_size='8'`` raised ``TypeError: '<' not supported between
instances of 'int' and 'str'`` from inside the backbone, and ``lr=abc`` torch's
``TypeError: '<=' not supported between instances of 'float' and 'str'``.
"""
from typing import Optional, Sequence, Tuple, Union

import pytest
from mmengine.config import Config

from mmdinomamba import zoo
from mmdinomamba.models import MLLA, DinoVim, LinearViT, PlainMLLA
from mmdinomamba.models.mixers import LinearAttentionMixer, SSDMixer
from mmdinomamba.utils.arg_types import (ArgTypeError, check_arg_types, check_like,
                                         matches_type)


def example(a: int, b: float = 1.0, c: Union[int, Tuple[int, int]] = 2,
            d: Optional[str] = None, e: Sequence[int] = (), f: bool = True, g=None):
    """Annotated as the backbones are."""


@pytest.mark.parametrize('annotation,good,bad', [
    (int, [0, -3], [True, 1.0, '1', None]),
    (float, [0, 1.5, -2], [True, '1.0', None, [1.0]]),
    (bool, [True, False], [0, 1, 'True']),
    (Union[int, Tuple[int, int]], [3, (3, 4), [3, 4]], [(3, ), (3, 4, 5), '3', (3, '4')]),
    (Optional[str], [None, 'x'], [1]),
    (Sequence[int], [[], (1, 2), [1]], [1, ['1'], 'ab']),
    (int | None, [None, 2], ['2']),
])
def test_matches_type_against_the_annotation(annotation, good, bad):
    assert all(matches_type(v, annotation) for v in good)
    assert not any(matches_type(v, annotation) for v in bad)


def test_check_arg_types_names_the_key_the_type_and_the_value():
    check_arg_types(example, dict(a=1, b=2, c=(1, 2), d=None, e=[3], f=False, g='x'),
                    'example')
    with pytest.raises(ArgTypeError, match=r"^example: a must be int, got '8' \(str\)$"):
        check_arg_types(example, dict(a='8'), 'example')
    with pytest.raises(ArgTypeError, match=r'^cfg\.c must be int or list of 2 int, got '
                       r'\[1, 2, 3\] \(list\)$'):
        check_arg_types(example, dict(a=1, c=[1, 2, 3]), 'cfg.')
    # both a TypeError (what it is) and a ValueError (what config checks raise)
    with pytest.raises(TypeError):
        check_arg_types(example, dict(b='x'), 'example')
    with pytest.raises(ValueError):
        check_arg_types(example, dict(f=1), 'example')


@pytest.mark.parametrize('cls,kwargs,match', [
    (DinoVim, dict(patch_size='8'), r"DinoVim: patch_size must be int, got '8' \(str\)"),
    (DinoVim, dict(drop_path_rate='0.1'), r'DinoVim: drop_path_rate must be number'),
    (DinoVim, dict(arch=dict(embed_dims='64', num_layers=2)),
     r"DinoVim: arch\.embed_dims must be int, got '64' \(str\)"),
    (DinoVim, dict(img_size='64'), r'DinoVim: img_size must be int or list of 2 int'),
    (LinearViT, dict(in_channels=3.0), r'LinearViT: in_channels must be int, got 3\.0'),
    (PlainMLLA, dict(qkv_bias='yes'), r'PlainMLLA: qkv_bias must be bool'),
    (MLLA, dict(arch=dict(embed_dims=64, depths=[2, '4', 8, 4], num_heads=[2, 4, 8, 16],
                          mlp_ratio=4.0)),
     r"MLLA: arch\.depths must be list of int, got \[2, '4', 8, 4\]"),
    (MLLA, dict(expand='2'), r"MLLA: expand must be int, got '2'"),
    (SSDMixer, dict(dim=64, d_state='16'), r"SSDMixer: d_state must be int, got '16'"),
    (LinearAttentionMixer, dict(dim=64, num_heads='2'),
     r"LinearAttentionMixer: num_heads must be int"),
])
def test_our_classes_name_a_wrong_type(cls, kwargs, match):
    with pytest.raises(ArgTypeError, match=match):
        cls(**kwargs)


def test_a_mixer_value_inside_a_backbone_is_named_by_the_mixer():
    with pytest.raises(ArgTypeError, match=r"SSDMixer: headdim must be int, got '16'"):
        DinoVim(arch=dict(embed_dims=32, num_layers=1), img_size=32, patch_size=8,
                mixer_cfg=dict(headdim='16'))


def test_check_like_reads_the_types_of_an_example():
    check_like(dict(a=1, b=[1, 2], c=0.5, d='new'), dict(a=2, b=[3], c=1.0), 'arch.')
    with pytest.raises(ArgTypeError, match=r'arch\.c must be number \(float\)'):
        check_like(dict(c='0.5'), dict(c=1.0), 'arch.')


def test_the_config_check_names_the_config_key():
    from mmdinomamba.engine import check_config_types
    path = zoo.config_path('dino', 'dino_dinovim-toy-p8_1xb8-10e_toy.py')
    cfg = Config.fromfile(path)
    check_config_types(cfg)  # the shipped values pass
    for key, value, match in [
            ('model.backbone.patch_size', '8',
             r"^model\.backbone\.patch_size must be int, got '8' \(str\)$"),
            ('optim_wrapper.optimizer.lr', 'abc',
             r"^optim_wrapper\.optimizer\.lr must be number \(float\) or Tensor, got "
             r"'abc' \(str\)$"),
            ('optim_wrapper.optimizer.weight_decay', 'none',
             r'^optim_wrapper\.optimizer\.weight_decay must be number'),
            ('param_scheduler.0.start_factor', '1e-4',
             r'^param_scheduler\[0\]\.start_factor must be number'),
            ('train_dataloader.batch_size', 8.0,
             r'^train_dataloader\.batch_size must be int, got 8\.0 \(float\)$')]:
        bad = Config.fromfile(path)
        bad.merge_from_dict({key: value})
        with pytest.raises(ArgTypeError, match=match):
            check_config_types(bad)


@pytest.mark.slow
def test_every_shipped_config_passes_the_type_check():
    """No false alarm: every shipped config's values fit the annotations."""
    from mmdinomamba.engine import check_config_types
    from tests.helpers.configs import leaf_configs, load
    paths = leaf_configs()
    assert len(paths) > 100
    for path in paths:
        check_config_types(load(path))
