"""DINO's multi-crop augmentation, assembled from mmpretrain's transforms.

"Emerging Properties in Self-Supervised Vision Transformers" (Caron et al., ICCV
2021), https://arxiv.org/abs/2104.14294, App. (data augmentation), which follows
BYOL's photometric augmentations.
"""
from typing import List, Optional, Tuple

from mmpretrain.datasets.transforms import MultiView

# BYOL/DINO photometric parameters
COLOR_JITTER = dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
COLOR_JITTER_PROB = 0.8
GRAYSCALE_PROB = 0.2
BLUR_RADIUS = (0.1, 2.0)
SOLARIZE_THRESHOLD = 128
# (Gaussian blur probability, solarisation probability) per kind of view
VIEW_PROBS = dict(global1=(1.0, 0.0), global2=(0.1, 0.2), local=(0.5, 0.0))


def dino_view_pipeline(size: int, crop_scale: Tuple[float, float], blur_prob: float,
                       solarize_prob: float, interpolation: str = 'bicubic',
                       color_jitter: Optional[dict] = None,
                       color_jitter_prob: float = COLOR_JITTER_PROB,
                       grayscale_prob: float = GRAYSCALE_PROB,
                       blur_radius: Tuple[float, float] = BLUR_RADIUS) -> List[dict]:
    """Transform configs of one DINO view (crop, flip, colour, blur, solarise).

    The blur radius is drawn uniformly from ``blur_radius`` for every image
    (``magnitude_std='inf'`` makes :class:`mmpretrain.GaussianBlur` draw its
    magnitude in ``[0, magnitude_level]``, mapped linearly onto the range).

    Args:
        size (int): output side in pixels.
        crop_scale (tuple): area fraction range of the random crop.
        blur_prob (float): probability of a Gaussian blur.
        solarize_prob (float): probability of solarisation (0 leaves it out).
        interpolation (str): resize interpolation. Defaults to 'bicubic'.
        color_jitter (dict, optional): brightness, contrast, saturation and hue
            of the colour jitter; None = DINO's ``COLOR_JITTER``.
        color_jitter_prob (float): probability of the colour jitter. Defaults to
            DINO's 0.8.
        grayscale_prob (float): probability of grayscale. Defaults to DINO's 0.2.
        blur_radius (tuple[float, float]): range of the Gaussian blur's radius
            (its sigma, in pixels of the view). Defaults to DINO's (0.1, 2.0).

    Returns:
        list[dict]: transform configs, scoped to mmpretrain so that they build
        whatever the default scope is.
    """
    pipeline = [
        dict(type='mmpretrain.RandomResizedCrop', scale=size, crop_ratio_range=crop_scale,
             interpolation=interpolation, backend='pillow'),
        dict(type='mmpretrain.RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='RandomApply', prob=color_jitter_prob,  # mmcv's, found from any scope
             transforms=[dict(type='mmpretrain.HueSafeColorJitter',
                              **(COLOR_JITTER if color_jitter is None
                                 else color_jitter))]),
        dict(type='mmpretrain.RandomGrayscale', prob=grayscale_prob, keep_channels=True,
             channel_weights=(0.114, 0.587, 0.2989)),
        dict(type='mmpretrain.GaussianBlur', magnitude_range=tuple(blur_radius),
             magnitude_std='inf', prob=blur_prob),
    ]
    if solarize_prob > 0:
        pipeline.append(dict(type='mmpretrain.Solarize', thr=SOLARIZE_THRESHOLD,
                             prob=solarize_prob))
    return pipeline


class DINOMultiCrop(MultiView):
    """Two global crops and ``num_local_views`` local crops of one image.

    Views come out in the order DINO expects: global 1 (blur p=1.0), global 2
    (blur p=0.1, solarisation p=0.2), then the local crops (blur p=0.5). Each
    view is a random resized crop, a horizontal flip, colour jitter (0.4, 0.4,
    0.2, 0.1) with p=0.8 (:class:`HueSafeColorJitter`, mmpretrain's ColorJitter
    made to work under numpy 2) and grayscale with p=0.2. ``results['img']`` becomes
    the list of views; follow with ``PackInputs``.

    Args:
        global_size (int): side of the global crops. Defaults to 224.
        local_size (int): side of the local crops. Defaults to 96.
        num_local_views (int): Defaults to 8.
        global_crop_scale (tuple[float, float]): area fraction range of global
            crops. Defaults to (0.4, 1.0).
        local_crop_scale (tuple[float, float]): area fraction range of local
            crops. Defaults to (0.05, 0.4).
        interpolation (str): resize interpolation. Defaults to 'bicubic'.
        color_jitter (dict, optional): ``brightness``, ``contrast``, ``saturation``
            and ``hue`` of the colour jitter; None (default) = DINO's (0.4, 0.4,
            0.2, 0.1).
        color_jitter_prob (float): probability of the colour jitter. Defaults to
            0.8.
        grayscale_prob (float): probability of grayscale. Defaults to 0.2.
        blur_radius (tuple[float, float]): range of the Gaussian blur's radius in
            pixels, drawn per view. Defaults to DINO's (0.1, 2.0), which is set
            for 224 px global crops: on smaller images scale it with the crop
            (e.g. ``(0.03, 0.57)`` for 64 px; a radius of 2 px wipes out a
            pattern of 4-8 px period there).
    """

    def __init__(self,
                 global_size: int = 224,
                 local_size: int = 96,
                 num_local_views: int = 8,
                 global_crop_scale: Tuple[float, float] = (0.4, 1.0),
                 local_crop_scale: Tuple[float, float] = (0.05, 0.4),
                 interpolation: str = 'bicubic',
                 color_jitter: Optional[dict] = None,
                 color_jitter_prob: float = COLOR_JITTER_PROB,
                 grayscale_prob: float = GRAYSCALE_PROB,
                 blur_radius: Tuple[float, float] = BLUR_RADIUS):
        if global_size <= 0 or local_size <= 0:
            raise ValueError(f'DINOMultiCrop: crop sizes must be > 0, got global '
                             f'{global_size}, local {local_size}')
        if num_local_views < 0:
            raise ValueError(f'DINOMultiCrop: num_local_views must be >= 0, got '
                             f'{num_local_views}')
        for name, (low, high) in (('global_crop_scale', global_crop_scale),
                                  ('local_crop_scale', local_crop_scale)):
            if not 0 < low <= high <= 1:
                raise ValueError(f'DINOMultiCrop: {name} must satisfy 0 < low <= '
                                 f'high <= 1, got {(low, high)}')
        if not 0 <= blur_radius[0] <= blur_radius[1]:
            raise ValueError(f'DINOMultiCrop: blur_radius must satisfy 0 <= low <= '
                             f'high, got {tuple(blur_radius)}')
        views = [('global1', global_size, global_crop_scale),
                 ('global2', global_size, global_crop_scale),
                 ('local', local_size, local_crop_scale)]
        transforms = [
            dino_view_pipeline(size, tuple(scale), *VIEW_PROBS[kind], interpolation,
                               color_jitter, color_jitter_prob, grayscale_prob,
                               blur_radius)
            for kind, size, scale in views
        ]
        super().__init__(transforms=transforms, num_views=[1, 1, num_local_views])
        self.global_size = global_size
        self.local_size = local_size
        self.num_local_views = num_local_views
