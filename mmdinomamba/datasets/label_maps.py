"""Label maps stored as RGB PNG files, class id = R + 256 * G (ImageNet-S).

ImageNet-S (https://github.com/LUSSeg/ImageNet-S) stores each semantic label map
as an RGB PNG whose pixel holds ``id = R + 256 * G`` (B unused): 0 is background,
1..919 are classes and 1000 marks pixels to ignore. :func:`encode_rgb_label_map`
and :func:`decode_rgb_label_map` are inverse pairs on ids in [0, 65535].
"""
import io
from typing import Union

import numpy as np
from PIL import Image

__all__ = ['IMAGENET_S_IGNORE_INDEX', 'decode_rgb_label_map', 'encode_rgb_label_map',
           'read_label_map']

IMAGENET_S_IGNORE_INDEX = 1000
MAX_ID = 256 * 256 - 1


def decode_rgb_label_map(rgb: np.ndarray) -> np.ndarray:
    """Class ids from an RGB(A) label image.

    Args:
        rgb (np.ndarray): (height, width, 3 or 4) uint8, channels R, G, B(, A).

    Returns:
        np.ndarray: (height, width) int64, ``R + 256 * G``.
    """
    if rgb.ndim != 3 or rgb.shape[-1] not in (3, 4) or rgb.dtype != np.uint8:
        raise ValueError('an RGB label map must be (height, width, 3 or 4) uint8, got '
                         f'{rgb.shape} {rgb.dtype}')
    return rgb[..., 0].astype(np.int64) + 256 * rgb[..., 1].astype(np.int64)


def encode_rgb_label_map(ids: np.ndarray) -> np.ndarray:
    """The RGB label image of class ids (inverse of :func:`decode_rgb_label_map`).

    Args:
        ids (np.ndarray): (height, width) integers in [0, 65535].

    Returns:
        np.ndarray: (height, width, 3) uint8, R = id % 256, G = id // 256, B = 0.
    """
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f'ids must be a (height, width) integer array, got '
                         f'{ids.shape} {ids.dtype}')
    if ids.size and (ids.min() < 0 or ids.max() > MAX_ID):
        raise ValueError(f'ids must lie in [0, {MAX_ID}], got [{ids.min()}, '
                         f'{ids.max()}]')
    return np.stack([ids % 256, ids // 256, np.zeros_like(ids)], -1).astype(np.uint8)


def read_label_map(source: Union[str, bytes], name: str = '') -> np.ndarray:
    """Read a label map PNG: RGB(A) is decoded as ``R + 256 * G``; a single-channel
    (grey or palette) image holds the ids directly.

    Args:
        source (str | bytes): a file path or the file's bytes.
        name (str): what to call the file in error messages (for bytes).

    Returns:
        np.ndarray: (height, width) int64 class ids.
    """
    name = name or (source if isinstance(source, str) else '<bytes>')
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes)
                        else source) as image:
            mode = image.mode
            array = np.array(image)
    except (OSError, ValueError) as err:
        raise ValueError(f'cannot read label map {name}: {err}') from err
    if mode in ('RGB', 'RGBA'):
        return decode_rgb_label_map(array)
    if mode in ('L', 'P', 'I', 'I;16'):
        return array.astype(np.int64)
    raise ValueError(f'label map {name} has unsupported PNG mode {mode!r}; '
                     "expected 'RGB'/'RGBA' (id = R + 256 G) or single channel")
