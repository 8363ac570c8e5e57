"""DINOMultiCrop: view count, sizes, order and per-view augmentation settings."""
import numpy as np
import pytest
import torch
from mmengine.dataset import default_collate
from mmpretrain.registry import MODELS, TRANSFORMS

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.datasets.transforms import (DINOMultiCrop, HueSafeColorJitter,
                                             adjust_hue, adjust_saturation)


def image(seed=0, size=80):
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def transforms_of(pipeline):
    return {type(t).__name__: t for t in pipeline.transforms}


def test_views_come_out_in_dino_order_and_sizes():
    crop = TRANSFORMS.build(dict(type='DINOMultiCrop', global_size=48, local_size=24,
                                 num_local_views=3))
    out = crop(dict(img=image()))
    assert [v.shape for v in out['img']] == [(48, 48, 3)] * 2 + [(24, 24, 3)] * 3
    assert all(v.dtype == np.uint8 for v in out['img'])


def test_view_settings_follow_the_paper():
    crop = DINOMultiCrop(global_size=32, local_size=16, num_local_views=2)
    g1, g2, local = (transforms_of(p) for p in crop.pipelines)
    for views, scale, size in ((g1, (0.4, 1.0), 32), (g2, (0.4, 1.0), 32),
                               (local, (0.05, 0.4), 16)):
        rrc = views['RandomResizedCrop']
        assert rrc.crop_ratio_range == scale and rrc.scale == (size, size)
        assert rrc.interpolation == 'bicubic'
        assert views['RandomFlip'].prob == 0.5
        assert views['RandomApply'].prob == 0.8
        jitter = views['RandomApply'].transforms.transforms[0]
        assert isinstance(jitter, HueSafeColorJitter)
        assert (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue) == \
            ((0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1))
        assert views['RandomGrayscale'].prob == 0.2
        blur = views['GaussianBlur']
        assert blur.radius is None and blur.magnitude_std == 'inf'
    assert [v['GaussianBlur'].prob for v in (g1, g2, local)] == [1.0, 0.1, 0.5]
    assert 'Solarize' not in g1 and 'Solarize' not in local
    assert (g2['Solarize'].prob, g2['Solarize'].thr) == (0.2, 128)


def test_colour_settings_can_be_changed_for_every_view():
    crop = DINOMultiCrop(global_size=32, local_size=16, num_local_views=1,
                         color_jitter=dict(brightness=0.4, contrast=0.4,
                                           saturation=0.8, hue=0.5),
                         color_jitter_prob=1.0, grayscale_prob=0.5)
    for views in (transforms_of(p) for p in crop.pipelines):
        assert views['RandomApply'].prob == 1.0
        jitter = views['RandomApply'].transforms.transforms[0]
        got = [jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue]
        assert np.allclose(got, [(0.6, 1.4), (0.6, 1.4), (0.2, 1.8), (-0.5, 0.5)])
        assert views['RandomGrayscale'].prob == 0.5
    out = crop(dict(img=image()))
    assert [v.shape for v in out['img']] == [(32, 32, 3)] * 2 + [(16, 16, 3)]


def test_blur_radius_is_drawn_per_image_in_range():
    blur = transforms_of(DINOMultiCrop().pipelines[0])['GaussianBlur']
    np.random.seed(0)
    radii = np.array([blur.random_magnitude() for _ in range(2000)])
    assert radii.min() >= 0.1 and radii.max() <= 2.0
    # uniform on [0.1, 2.0]: mean 1.05, sd 0.55; 2000 draws -> 4-sigma band 0.05
    assert abs(radii.mean() - 1.05) < 0.05 and len(np.unique(radii)) == 2000


def test_blur_radius_can_be_scaled_to_the_image():
    crop = DINOMultiCrop(global_size=64, local_size=32, blur_radius=(0.03, 0.57))
    np.random.seed(0)
    for views in (transforms_of(p) for p in crop.pipelines):
        radii = np.array([views['GaussianBlur'].random_magnitude() for _ in range(500)])
        assert radii.min() >= 0.03 and radii.max() <= 0.57 and np.ptp(radii) > 0.5


def test_batches_reach_the_model_as_a_list_of_views():
    pipeline = [TRANSFORMS.build(dict(type='DINOMultiCrop', global_size=32,
                                      local_size=16, num_local_views=2)),
                TRANSFORMS.build(dict(type='PackInputs'))]
    samples = []
    for seed in range(3):
        results = dict(img=image(seed))
        for t in pipeline:
            results = t(results)
        samples.append(results)
    preprocessor = MODELS.build(dict(type='SelfSupDataPreprocessor', mean=[0, 0, 0],
                                     std=[1, 1, 1], to_rgb=True))
    inputs = preprocessor(default_collate(samples), True)['inputs']
    assert [tuple(v.shape) for v in inputs] == [(3, 3, 32, 32)] * 2 + [(3, 3, 16, 16)] * 2
    assert all(v.dtype == torch.float32 for v in inputs)


@pytest.mark.parametrize('kwargs,match', [
    (dict(global_size=0), 'crop sizes'),
    (dict(num_local_views=-1), 'num_local_views'),
    (dict(local_crop_scale=(0.5, 0.1)), 'local_crop_scale'),
    (dict(global_crop_scale=(0.0, 1.0)), 'global_crop_scale'),
    (dict(blur_radius=(1.0, 0.5)), 'blur_radius'),
    (dict(blur_radius=(-0.1, 0.5)), 'blur_radius'),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DINOMultiCrop(**kwargs)


def test_hue_shift_matches_mmcv_and_works_for_negative_factors():
    import mmcv
    from PIL import Image
    img = image(3, size=24)
    for factor in (0.0, 0.05, 0.1, 0.37):  # where mmcv 2.1 works under numpy 2
        assert np.array_equal(adjust_hue(img, factor),
                              mmcv.adjust_hue(img, factor, backend='pillow'))
    with pytest.raises(OverflowError):  # the bug HueSafeColorJitter avoids
        mmcv.adjust_hue(img, -0.1, backend='pillow')
    # negative factor: the HSV hue of saturated, bright pixels moves by
    # int(-0.1 * 255) = -25 levels (mod 256); the HSV->RGB->HSV round trip of
    # Pillow's 8-bit HSV is exact to +-2 levels for such pixels
    colourful = np.stack(np.meshgrid(np.arange(0, 256, 8), np.arange(0, 256, 8)),
                         -1).astype(np.uint8)
    colourful = np.concatenate([colourful, np.full_like(colourful[..., :1], 255)], -1)
    hsv_in = np.array(Image.fromarray(colourful[..., ::-1].copy(), 'RGB').convert('HSV'))
    out = adjust_hue(colourful, -0.1)
    hsv_out = np.array(Image.fromarray(out[..., ::-1].copy(), 'RGB').convert('HSV'))
    good = (hsv_in[..., 1] > 128) & (hsv_in[..., 2] > 128)
    diff = (hsv_out[..., 0].astype(int) - hsv_in[..., 0].astype(int) + 25 + 128) % 256 - 128
    assert good.sum() > 100 and np.abs(diff[good]).max() <= 2


def test_hue_safe_color_jitter_runs_with_negative_hues():
    jitter = TRANSFORMS.build(dict(type='HueSafeColorJitter', brightness=0.4,
                                   contrast=0.4, saturation=0.2, hue=0.1))
    np.random.seed(0)
    outs = [jitter(dict(img=image(1, 16)))['img'] for _ in range(20)]
    assert all(o.shape == (16, 16, 3) and o.dtype == np.uint8 for o in outs)
    assert len({o.tobytes() for o in outs}) == 20


def test_saturation_matches_mmcv_pillow_bit_for_bit_without_its_warning():
    """mmcv's Pillow path warned on every call ("Only use 'alpha' for pillow
    backend", once per data worker and epoch in every DINO run); ours computes the
    same pixels and warns nothing, and the jitter takes it."""
    import warnings

    import mmcv
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)
    for alpha in (0.0, 0.6, 1.0, 1.4):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            expected = mmcv.adjust_color(img, alpha=alpha, backend='pillow')
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            ours = adjust_saturation(img, alpha)
            HueSafeColorJitter(saturation=0.5).transform(dict(img=img.copy()))
        assert np.array_equal(ours, expected), alpha
        assert caught == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        mmcv.adjust_color(img, alpha=0.5, backend='pillow')
    assert any('pillow' in str(w.message) for w in caught)  # what it replaces
    with pytest.raises(ValueError, match='uint8'):
        adjust_saturation(img.astype(np.float32), 0.5)
