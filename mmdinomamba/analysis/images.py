"""Images for analysis, through a config's test pipeline and data preprocessor.

The pipeline is the config's ``test_dataloader.dataset.pipeline`` (else
``test_pipeline``), the preprocessor its ``model.data_preprocessor`` (else
``data_preprocessor``). A config without them (e.g. a bare ``model`` config of
``configs/analysis/``) gets mmpretrain's ImageNet evaluation defaults:
:func:`default_pipeline` (shorter side resized to ``size``, bicubic, centre crop)
and :data:`DEFAULT_PREPROCESSOR` (ImageNet mean and std on the 0-255 scale, BGR
to RGB). In-memory images (the toy generator's) skip the pipeline's file-loading
step. A self-supervised config's multi-view preprocessor (DINO's
``SelfSupDataPreprocessor``, which returns a list of views) becomes the
single-image ``ImgDataPreprocessor`` with the same mean, std and channel order, as
does a preprocessor without a ``type`` (a classifier config's). Needs mmcv and
mmpretrain (the transforms).
"""
import os
import os.path as osp
from typing import List, Optional, Sequence

import numpy as np
import torch
from mmengine.config import Config

Tensor = torch.Tensor

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')
# mmpretrain's ImageNet data preprocessor (RGB, 0-255 scale)
DEFAULT_PREPROCESSOR = dict(type='ImgDataPreprocessor',
                            mean=[123.675, 116.28, 103.53],
                            std=[58.395, 57.12, 57.375], bgr_to_rgb=True)
LOADING_TRANSFORMS = ('LoadImageFromFile', 'mmpretrain.LoadImageFromFile',
                      'mmcv.LoadImageFromFile')
MULTI_VIEW_PREPROCESSORS = ('SelfSupDataPreprocessor',
                            'mmpretrain.SelfSupDataPreprocessor')

__all__ = ['DEFAULT_PREPROCESSOR', 'IMAGE_EXTENSIONS', 'ImagePipeline',
           'default_pipeline', 'folder_images', 'image_paths', 'toy_images']


def default_pipeline(size: int) -> List[dict]:
    """mmpretrain's ImageNet evaluation pipeline at ``size``: load, resize the
    shorter side to ``size`` (bicubic), centre crop ``size`` x ``size``, pack."""
    return [
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=size, edge='short', backend='pillow',
             interpolation='bicubic'),
        dict(type='CenterCrop', crop_size=size),
        dict(type='PackInputs'),
    ]


def single_view_preprocessor(pre: dict) -> dict:
    """``pre`` itself, or the single-image ``ImgDataPreprocessor`` that normalises
    alike for a multi-view (self-supervised) preprocessor and for one without a
    ``type`` (mmpretrain's top-level ``data_preprocessor = dict(num_classes=...,
    mean=..., std=..., to_rgb=True)`` of the classifier and linear-probe configs,
    whose type the classifier fills in)."""
    if 'type' in pre and pre['type'] not in MULTI_VIEW_PREPROCESSORS:
        return pre
    return dict(type='ImgDataPreprocessor', mean=pre.get('mean'), std=pre.get('std'),
                bgr_to_rgb=bool(pre.get('to_rgb') or pre.get('bgr_to_rgb')),
                rgb_to_bgr=bool(pre.get('rgb_to_bgr')))


def _config_pipeline(cfg: Config) -> Optional[list]:
    loader = cfg.get('test_dataloader') or {}
    pipeline = (loader.get('dataset') or {}).get('pipeline') or cfg.get('test_pipeline')
    return list(pipeline) if pipeline else None


class ImagePipeline:
    """A config's test pipeline and data preprocessor, applied to images.

    Args:
        cfg (Config): the config.
        size (int): image side of the default pipeline (used only when the config
            has none).
    """

    def __init__(self, cfg: Config, size: int):
        from mmengine.dataset import Compose
        from mmengine.registry import MODELS, init_default_scope
        import mmdinomamba  # noqa: F401  registers our transforms
        init_default_scope(cfg.get('default_scope') or 'mmpretrain')
        pipeline = _config_pipeline(cfg)
        self.from_config = pipeline is not None
        pipeline = pipeline or default_pipeline(size)
        self.transforms = Compose(pipeline)
        self.array_transforms = Compose(
            [t for t in pipeline if t.get('type') not in LOADING_TRANSFORMS])
        model = cfg.get('model') or {}
        pre = model.get('data_preprocessor') or cfg.get('data_preprocessor') or \
            DEFAULT_PREPROCESSOR
        self.preprocessor = MODELS.build(single_view_preprocessor(dict(pre)))

    def _batch(self, samples: List[dict]) -> Tensor:
        from mmengine.dataset import pseudo_collate
        return self.preprocessor(pseudo_collate(samples), False)['inputs']

    def from_files(self, paths: Sequence[str]) -> Tensor:
        """(num, 3, height, width), normalised, from image files."""
        return self._batch([self.transforms(dict(img_path=p)) for p in paths])

    def from_arrays(self, images: Sequence[np.ndarray]) -> Tensor:
        """(num, 3, height, width), normalised, from uint8 RGB (height, width, 3)."""
        samples = []
        for image in images:
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ValueError(f'expected a uint8 RGB image (height, width, 3), got '
                                 f'{image.dtype} {image.shape}')
            bgr = np.ascontiguousarray(image[..., ::-1])  # as LoadImageFromFile gives
            samples.append(self.array_transforms(dict(
                img=bgr, img_shape=bgr.shape[:2], ori_shape=bgr.shape[:2])))
        return self._batch(samples)


def image_paths(folder: str) -> List[str]:
    """Image files under ``folder`` (searched recursively), sorted."""
    if not osp.isdir(folder):
        raise FileNotFoundError(f'image folder {folder!r} does not exist')
    paths = sorted(
        osp.join(root, name) for root, _, names in os.walk(folder) for name in names
        if name.lower().endswith(IMAGE_EXTENSIONS))
    if not paths:
        raise ValueError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) under {folder!r}')
    return paths


def folder_images(pipeline: ImagePipeline, folder: str, num: int) -> Tensor:
    """The first ``num`` images (sorted paths) of a folder through ``pipeline``.

    Returns:
        Tensor: (num_found, 3, height, width), normalised; num_found <= num.
    """
    return pipeline.from_files(image_paths(folder)[:num])


def toy_images(pipeline: ImagePipeline, num: int, size: int, seed: int = 0,
               num_classes: int = 4) -> Tensor:
    """``num`` images of the toy generator (:mod:`mmdinomamba.datasets.toy`)
    through ``pipeline``.

    Image ``i`` has class ``i % num_classes``, is ``size`` x ``size`` and is drawn
    from ``numpy.random.default_rng([seed, i])``.

    Returns:
        Tensor: (num, 3, height, width), normalised.
    """
    from mmdinomamba.datasets import render_toy_sample
    if num < 1:
        raise ValueError(f'num must be >= 1, got {num}')
    return pipeline.from_arrays([
        render_toy_sample(np.random.default_rng([seed, i]), i % num_classes,
                          num_classes, size)[0] for i in range(num)])
