"""mmpretrain's ColorJitter with a hue shift that works under numpy 2.

mmcv 2.1's ``adjust_hue`` computes ``np.uint8(hue_factor * 255)``, which numpy
>= 2 refuses for negative factors ("OverflowError: Python integer -17 out of bounds
for uint8"), so ``ColorJitter(hue=0.1)`` fails on about half of the images. The
subclass below draws the same random parameters and applies the same operations
in the same random order; only the hue shift is computed here, with the
wrap-around that numpy 1 gave, and the saturation on the Pillow backend, which
mmcv's ``adjust_color`` computes the same way but with a warning on every call
("Only use 'alpha' for pillow backend": nothing a user can act on).
"""
import mmcv
import numpy as np
from mmpretrain.datasets.transforms import ColorJitter
from PIL import Image, ImageEnhance


def adjust_saturation(img: np.ndarray, alpha: float) -> np.ndarray:
    """Blend a BGR uint8 image with its grey version by ``alpha`` (Pillow's
    ``ImageEnhance.Color``: 0 grey, 1 unchanged), as ``mmcv.adjust_color(img,
    alpha, backend='pillow')`` does.

    Args:
        img (ndarray): (height, width, 3) uint8, BGR.
        alpha (float): the saturation factor, >= 0.

    Returns:
        ndarray: (height, width, 3) uint8, BGR.
    """
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f'adjust_saturation: expected a (height, width, 3) uint8 '
                         f'image, got {img.dtype} {img.shape}')
    rgb = Image.fromarray(np.ascontiguousarray(img[..., ::-1]), 'RGB')
    enhanced = np.array(ImageEnhance.Color(rgb).enhance(alpha))
    return np.ascontiguousarray(enhanced[..., ::-1])


def adjust_hue(img: np.ndarray, hue_factor: float) -> np.ndarray:
    """Shift the hue of a BGR uint8 image cyclically by ``hue_factor`` turns.

    As torchvision and mmcv (Pillow backend): convert to Pillow's 8-bit HSV, add
    ``int(hue_factor * 255)`` to H modulo 256, convert back.

    Args:
        img (ndarray): (height, width, 3) uint8, BGR.
        hue_factor (float): in [-0.5, 0.5].

    Returns:
        ndarray: (height, width, 3) uint8, BGR.
    """
    if not -0.5 <= hue_factor <= 0.5:
        raise ValueError(f'adjust_hue: hue_factor must be in [-0.5, 0.5], got '
                         f'{hue_factor}')
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f'adjust_hue: expected a (height, width, 3) uint8 image, got '
                         f'{img.dtype} {img.shape}')
    hsv = np.array(Image.fromarray(np.ascontiguousarray(img[..., ::-1]), 'RGB')
                   .convert('HSV'))
    shift = int(hue_factor * 255) % 256
    hsv[..., 0] = ((hsv[..., 0].astype(np.int16) + shift) % 256).astype(np.uint8)
    rgb = np.array(Image.fromarray(hsv, 'HSV').convert('RGB'))
    return np.ascontiguousarray(rgb[..., ::-1])


class HueSafeColorJitter(ColorJitter):
    """:class:`mmpretrain.ColorJitter` whose hue shift works under numpy 2.

    Same arguments and behaviour as the parent (brightness, contrast, saturation
    and hue applied in a random order with random magnitudes); see the module
    docstring for why it exists.
    """

    def transform(self, results: dict) -> dict:
        img = results['img']
        order, brightness, contrast, saturation, hue = self._rand_params()
        for index in order:
            if index == 0 and brightness is not None:
                img = mmcv.adjust_brightness(img, brightness, backend=self.backend)
            elif index == 1 and contrast is not None:
                img = mmcv.adjust_contrast(img, contrast, backend=self.backend)
            elif index == 2 and saturation is not None:
                img = (adjust_saturation(img, saturation) if self.backend == 'pillow'
                       else mmcv.adjust_color(img, alpha=saturation, backend=self.backend))
            elif index == 3 and hue is not None:
                img = adjust_hue(img, hue)
        results['img'] = img
        return results
