"""A deterministic toy dataset: coloured shapes on textured backgrounds, with masks.

Each image has one class ``c`` and 1-3 objects on a low-saturation textured
background (noise blocks, stripes, gradient or checkerboard). Class ``c`` is a shape
(``ellipse``, ``rectangle``, ``triangle``, cycling with c) painted in its own hue
``c / num_classes``; the first object is of class c and is the largest by area, the
others are smaller objects of random classes. Objects never overlap, are strongly
saturated (HSV saturation >= 0.65, value >= 0.4) and have their own stripes/noise
texture in brightness; the background's saturation stays <= 0.2. So a mask can be
read back from the image alone, and a linear probe can learn shape and colour.

``style='rich'`` (``make_toy_dataset(..., style='rich')``) is the harder variant
for self-supervised training and the mixer comparison: class ``c`` is a shape among
``RICH_SHAPES`` (``c mod 4``) *and* an object texture among ``RICH_TEXTURES``
(``c mod 3``), so the first 12 classes are distinct (shape, texture) pairs; the
colour of every object is random (no class information in colour). The background
is cluttered: a mosaic of 3 x 3 to 5 x 5 tiles, each of its own random hue,
saturation, brightness and pattern, then 3-6 small distractor shapes of random colours (background in the masks). On it, one main
object of the image's class (the largest) and, half of the time, one smaller
object of a random class; objects do not overlap each other. A mask can no longer
be read from the saturation; the label maps are the truth. Class names are
``c<kkk>_<shape>-<texture>``. ``placement`` (:data:`PLACEMENTS`) says where its
shapes go: 'centred' (the default) keeps each inside the image, so object pixels
crowd the centre; 'uniform' (the comparison recipe's data) draws each centre
anywhere in the image and cuts the shape at the border.

Everything is seeded: sample ``i`` of split ``s`` draws from
``numpy.random.default_rng([seed, s, i])``, so the bytes of every file depend only
on the arguments (and the PNG/JPEG encoders).

Layout under ``out_dir`` (``stem = <class_name>_<iiiii>``)::

    classes.txt                         one class name per line, line k = class k
    train/<class_name>/<stem>.png       ImageNet folder layout (lossless PNG)
    val/<class_name>/<stem>.png
    meta/train.txt, meta/val.txt        mmpretrain ImageNet annotations:
                                        "<class_name>/<stem>.png <class id>", paths
                                        relative to the split folder (data_prefix)
    masks/{train,val}/<class_name>/<stem>.png
                                        ImageNet-S style RGB label maps:
                                        id = R + 256 * G, 0 = background, object
                                        pixels = its class id + 1
    ade/images/{training,validation}/<stem>.jpg
    ade/annotations/{training,validation}/<stem>.png
                                        mmseg/ADE20K style single-channel labels:
                                        0 = background, object = class id + 1. With
                                        mmseg's ``reduce_zero_label=True`` (ADE20K's
                                        default) background becomes 255 (ignored)
                                        and object labels become the class ids
                                        0..num_classes-1; with
                                        ``reduce_zero_label=False`` there are
                                        num_classes + 1 classes, 0 = background.
    coco/{train,val}/<stem>.jpg
    coco/annotations/instances_{train,val}.json
                                        COCO instances: category_id = class id + 1;
                                        rectangles and triangles as polygons,
                                        ellipses as uncompressed RLE; bbox [x, y, w, h]
                                        and area from the pixel mask
    toy_data.json                       stamp: the arguments (a rerun with the same
                                        arguments is a no-op)

For Binary-AUC, every layout uses 0 as its only background label
(``background_indices=(0,)``) and needs no ``ignore_index``.

The mask convention: pixel (row i, column j) covers [j, j + 1) x [i, i + 1) and
belongs to a shape when its centre (j + 0.5, i + 0.5) is inside it; polygons are in
these continuous coordinates, as in COCO.
"""
import io
import json
import os
import os.path as osp
import shutil
import tempfile
from dataclasses import dataclass
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.logging import print_log
from PIL import Image

__all__ = ['PLACEMENTS', 'SHAPES', 'RICH_SHAPES', 'RICH_TEXTURES', 'STYLES', 'ToyObject',
           'toy_class_names', 'render_toy_sample', 'render_rich_sample',
           'mask_to_rle', 'make_toy_dataset']

SHAPES = ('ellipse', 'rectangle', 'triangle')
RICH_SHAPES = ('ellipse', 'rectangle', 'triangle', 'cross')
RICH_TEXTURES = ('stripes', 'checker', 'dots')
STYLES = ('simple', 'rich')
# where the rich style puts its shapes: 'centred' keeps each shape's bounding disc
# inside the image, so object pixels crowd the centre (68 % of them in the central
# quarter of the comparison's 64 px images); 'uniform' draws the centre anywhere
# in the image (up to a quarter radius beyond) and cuts the shape at the border
# (26 % there: about its share of the area)
PLACEMENTS = ('centred', 'uniform')
FORMATS = ('imagenet', 'ade', 'coco')
SPLITS = ('train', 'val')
ADE_SPLITS = {'train': 'training', 'val': 'validation'}
STAMP = 'toy_data.json'
GENERATOR_VERSION = 1
MAX_CLASSES = 254  # labels class id + 1 must fit the uint8 ADE annotations
BACKGROUND_MAX_SATURATION = 0.2
OBJECT_MIN_SATURATION = 0.65


@dataclass(frozen=True, eq=False)
class ToyObject:
    """One rendered object.

    Attributes:
        label (int): class id in [0, num_classes).
        shape (str): one of ``SHAPES`` (rich style: ``RICH_SHAPES``).
        mask (np.ndarray): (height, width) bool, its pixels.
        polygon (tuple[float, ...], optional): (x0, y0, x1, y1, ...) vertices for
            rectangles and triangles, None for ellipses.
    """
    label: int
    shape: str
    mask: np.ndarray
    polygon: Optional[Tuple[float, ...]]


def _rich_class(label: int) -> Tuple[str, str]:
    """(shape, texture) of class ``label`` in the rich style."""
    return (RICH_SHAPES[label % len(RICH_SHAPES)],
            RICH_TEXTURES[label % len(RICH_TEXTURES)])


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f'unknown style {style!r}; choose one of {STYLES}')


def toy_class_names(num_classes: int, style: str = 'simple') -> List[str]:
    """Class names ``c<kkk>_<shape>`` (rich: ``c<kkk>_<shape>-<texture>``); they
    sort in class-id order."""
    _check_style(style)
    if style == 'rich':
        return [f'c{k:03d}_' + '-'.join(_rich_class(k)) for k in range(num_classes)]
    return [f'c{k:03d}_{SHAPES[k % len(SHAPES)]}' for k in range(num_classes)]


def _hsv_to_rgb(hue: np.ndarray, sat: np.ndarray, val: np.ndarray) -> np.ndarray:
    """HSV in [0, 1] to RGB in [0, 1].

    Args:
        hue, sat, val (np.ndarray): (height, width) each.

    Returns:
        np.ndarray: (height, width, 3) float64.
    """
    sector = np.floor(hue * 6.0) % 6
    frac = hue * 6.0 - np.floor(hue * 6.0)
    p = val * (1 - sat)
    q = val * (1 - sat * frac)
    t = val * (1 - sat * (1 - frac))
    table = [(val, t, p), (q, val, p), (p, val, t), (p, q, val), (t, p, val),
             (val, p, q)]
    rgb = np.zeros(hue.shape + (3, ))
    for k, channels in enumerate(table):
        where = sector == k
        for c in range(3):
            rgb[..., c][where] = channels[c][where]
    return rgb


def _pattern(rng: np.random.Generator, size: int, kinds: Sequence[str]) -> np.ndarray:
    """A texture field in [-1, 1], (size, size), of a random kind among ``kinds``."""
    kind = kinds[rng.integers(len(kinds))]
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    angle = rng.uniform(0, np.pi)
    along = xs * np.cos(angle) + ys * np.sin(angle)
    if kind == 'noise':
        block = int(rng.integers(2, max(3, size // 8)))
        cells = -(-size // block)
        coarse = rng.uniform(-1, 1, (cells, cells))
        return np.kron(coarse, np.ones((block, block)))[:size, :size]
    if kind == 'stripes':
        period = rng.uniform(4, max(5, size / 4))
        return np.sin(2 * np.pi * along / period + rng.uniform(0, 2 * np.pi))
    if kind == 'gradient':
        return 2 * (along - along.min()) / (along.max() - along.min()) - 1
    if kind == 'checker':
        period = rng.uniform(6, max(7, size / 3))
        return np.sign(np.sin(np.pi * xs / period) * np.sin(np.pi * ys / period))
    raise ValueError(f'unknown pattern kind {kind!r}')


def _convex_polygon_mask(vertices: np.ndarray, size: int) -> np.ndarray:
    """Pixels whose centres lie inside a convex polygon.

    Args:
        vertices (np.ndarray): (num_vertices, 2) as (x, y), either orientation.
        size (int): image side.

    Returns:
        np.ndarray: (size, size) bool.
    """
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    edges = np.roll(vertices, -1, axis=0) - vertices
    # cross(edge, p - v) for every edge and pixel: (num_vertices, size, size).
    cross = (edges[:, 0, None, None] * (ys[None] - vertices[:, 1, None, None]) -
             edges[:, 1, None, None] * (xs[None] - vertices[:, 0, None, None]))
    return (cross >= 0).all(0) | (cross <= 0).all(0)


def _centre_range(size: int, radius: float, placement: str) -> Tuple[float, float]:
    """The range of a shape's centre coordinates (:data:`PLACEMENTS`)."""
    if placement == 'centred':
        return radius, size - radius
    # a quarter radius beyond the border: object pixels fall in the central
    # quarter of the image about as often as its area (26 % against 25 %,
    # measured on the comparison's 64 px rich images)
    return -radius / 4, size + radius / 4


def _shape_mask(rng: np.random.Generator, shape: str, size: int,
                radius: float, placement: str = 'centred'
                ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Rasterise a random shape that fits in a disc of ``radius`` about its
    centre: the disc inside the image ('centred'), or the centre anywhere in it
    or up to a quarter radius beyond, the shape cut at the border ('uniform';
    :data:`PLACEMENTS`).

    Returns:
        tuple: mask (size, size) bool and vertices (num_vertices, 2) or None.
    """
    centre = rng.uniform(*_centre_range(size, radius, placement), 2)
    angle = rng.uniform(0, np.pi)
    rotation = np.array([[np.cos(angle), -np.sin(angle)],
                         [np.sin(angle), np.cos(angle)]])
    if shape == 'ellipse':
        axes = radius * rng.uniform(0.6, 1.0, 2)
        ys, xs = np.mgrid[0:size, 0:size] + 0.5
        local = np.stack([xs - centre[0], ys - centre[1]], -1) @ rotation
        return ((local / axes)**2).sum(-1) <= 1, None
    if shape == 'cross':
        # two bars through the centre, at right angles: a non-convex union
        width = rng.uniform(0.28, 0.4)
        mask = np.zeros((size, size), bool)
        for bar in (np.array([[-1, -width], [1, -width], [1, width], [-1, width]]),
                    np.array([[-width, -1], [width, -1], [width, 1], [-width, 1]])):
            mask |= _convex_polygon_mask(radius * 0.95 * bar @ rotation.T + centre,
                                         size)
        return mask, None
    if shape == 'rectangle':
        spread = rng.uniform(0.45, 1.12)
        half = radius * np.array([np.cos(spread), np.sin(spread)])
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * half
    elif shape == 'triangle':
        corner_angles = np.arange(3) * 2 * np.pi / 3 + rng.uniform(-0.3, 0.3, 3)
        corners = radius * rng.uniform(0.8, 1.0, (3, 1)) * np.stack(
            [np.cos(corner_angles), np.sin(corner_angles)], -1)
    else:
        raise ValueError(f'unknown shape {shape!r}, choose from {RICH_SHAPES}')
    # Rounded as written to the COCO file, so the polygon there defines the mask.
    vertices = np.round(corners @ rotation.T + centre, 2)
    return _convex_polygon_mask(vertices, size), vertices


def render_toy_sample(rng: np.random.Generator, label: int, num_classes: int,
                      size: int) -> Tuple[np.ndarray, np.ndarray, List[ToyObject]]:
    """Draw one image of class ``label``.

    Args:
        rng (np.random.Generator): the sample's generator.
        label (int): image class in [0, num_classes).
        num_classes (int): number of classes.
        size (int): image side in pixels.

    Returns:
        tuple: image (size, size, 3) uint8 RGB, label map (size, size) int64 with
        0 = background and class id + 1 on object pixels, and the objects (the
        first one is of class ``label`` and has the largest area).
    """
    hue = np.full((size, size), rng.uniform())
    sat = np.full((size, size), rng.uniform(0, BACKGROUND_MAX_SATURATION))
    val = np.clip(rng.uniform(0.3, 0.7) +
                  0.25 * _pattern(rng, size, ('noise', 'stripes', 'gradient',
                                              'checker')), 0.15, 0.95)
    label_map = np.zeros((size, size), np.int64)
    objects: List[ToyObject] = []
    num_objects = int(rng.integers(1, 4))
    for index in range(num_objects):
        obj_label = label if index == 0 else int(rng.integers(num_classes))
        shape = SHAPES[obj_label % len(SHAPES)]
        radius_range = (0.2, 0.32) if index == 0 else (0.1, 0.17)
        for _ in range(20):
            mask, vertices = _shape_mask(rng, shape, size,
                                         size * rng.uniform(*radius_range))
            area = int(mask.sum())
            fits = area > 0 and not (mask & (label_map > 0)).any()
            if fits and (index == 0 or area < objects[0].mask.sum()):
                break
        else:
            if index == 0:
                raise RuntimeError('could not place the main object; the image '
                                   f'size {size} is too small')
            continue
        obj_hue = (obj_label + rng.uniform(-0.1, 0.1)) / num_classes % 1.0
        texture = _pattern(rng, size, ('noise', 'stripes'))
        hue[mask] = obj_hue
        sat[mask] = rng.uniform(OBJECT_MIN_SATURATION, 1.0)
        val[mask] = np.clip(rng.uniform(0.6, 0.85) + 0.15 * texture[mask], 0.4, 1.0)
        label_map[mask] = obj_label + 1
        polygon = None if vertices is None else tuple(
            float(v) for v in vertices.reshape(-1))
        objects.append(ToyObject(obj_label, shape, mask, polygon))
    image = np.round(_hsv_to_rgb(hue, sat, val) * 255).astype(np.uint8)
    return image, label_map, objects


def _texture(rng: np.random.Generator, kind: str, size: int) -> np.ndarray:
    """An object texture in [-1, 1], (size, size): 'stripes', 'checker' or 'dots'.

    Periods scale with the image (size / 16 to size / 8 pixels), so a 64 px image
    with 8 px patches shows one to two periods per patch.
    """
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    angle = rng.uniform(0, np.pi)
    u = xs * np.cos(angle) + ys * np.sin(angle)
    v = -xs * np.sin(angle) + ys * np.cos(angle)
    period = rng.uniform(size / 16, size / 8)
    phase = rng.uniform(0, 2 * np.pi, 2)
    if kind == 'stripes':
        return np.sign(np.sin(2 * np.pi * u / period + phase[0]))
    if kind == 'checker':
        return np.sign(np.sin(np.pi * u / period + phase[0]) *
                       np.sin(np.pi * v / period + phase[1]))
    if kind == 'dots':
        wave = np.sin(2 * np.pi * u / period + phase[0]) * \
            np.sin(2 * np.pi * v / period + phase[1])
        return np.where(wave > 0.5, 1.0, -1.0)
    raise ValueError(f'unknown texture {kind!r}, choose from {RICH_TEXTURES}')


def _place(rng: np.random.Generator, shape: str, size: int, radius_range,
           taken: np.ndarray, tries: int = 20,
           placement: str = 'centred') -> Tuple[Optional[np.ndarray],
                                                Optional[np.ndarray]]:
    """A random shape whose pixels miss ``taken``; (None, None) after ``tries``."""
    for _ in range(tries):
        mask, vertices = _shape_mask(rng, shape, size,
                                     size * rng.uniform(*radius_range), placement)
        if mask.any() and not (mask & taken).any():
            return mask, vertices
    return None, None


def render_rich_sample(rng: np.random.Generator, label: int, num_classes: int,
                       size: int, placement: str = 'centred'
                       ) -> Tuple[np.ndarray, np.ndarray, List[ToyObject]]:
    """Draw one image of class ``label`` in the rich style (module docstring).

    Args:
        rng (np.random.Generator): the sample's generator.
        label (int): image class in [0, num_classes).
        num_classes (int): number of classes.
        size (int): image side in pixels.
        placement (str): where shapes go (:data:`PLACEMENTS`). Defaults to
            'centred'.

    Returns:
        tuple: image (size, size, 3) uint8 RGB, label map (size, size) int64 with
        0 = background (clutter included) and class id + 1 on object pixels, and
        the objects (the first one is of class ``label``, the largest).
    """
    # a mosaic of tiles, each its own hue, saturation, brightness and pattern, so
    # that two crops of one image share its objects but not its background
    tiles = int(rng.integers(3, 6))
    edges = np.linspace(0, size, tiles + 1).round().astype(int)
    hue, sat, val = (np.empty((size, size)) for _ in range(3))
    for r in range(tiles):
        for c in range(tiles):
            rows = slice(edges[r], edges[r + 1])
            cols = slice(edges[c], edges[c + 1])
            hue[rows, cols] = rng.uniform()
            sat[rows, cols] = rng.uniform(0, 0.6)
            pattern = _pattern(rng, size, ('noise', 'stripes', 'gradient', 'checker'))
            val[rows, cols] = np.clip(rng.uniform(0.25, 0.75) +
                                      0.2 * pattern[rows, cols], 0.05, 0.95)
    nothing = np.zeros((size, size), bool)
    for _ in range(int(rng.integers(3, 7))):
        mask, _ = _place(rng, RICH_SHAPES[rng.integers(len(RICH_SHAPES))], size,
                         (0.04, 0.08), nothing, tries=1, placement=placement)
        if mask is None:
            continue
        hue[mask] = rng.uniform()
        sat[mask] = rng.uniform(0.2, 1.0)
        val[mask] = np.clip(rng.uniform(0.2, 0.9) +
                            0.1 * _pattern(rng, size, ('noise', ))[mask], 0.05, 1.0)
    label_map = np.zeros((size, size), np.int64)
    objects: List[ToyObject] = []
    num_objects = 1 + int(rng.integers(2))
    for index in range(num_objects):
        obj_label = label if index == 0 else int(rng.integers(num_classes))
        shape, texture = _rich_class(obj_label)
        radius_range = (0.3, 0.42) if index == 0 else (0.1, 0.16)
        mask, vertices = _place(rng, shape, size, radius_range, label_map > 0,
                                placement=placement)
        if mask is not None and index > 0 and mask.sum() >= objects[0].mask.sum():
            mask = None
        if mask is None:
            if index == 0:
                raise RuntimeError('could not place the main object; the image '
                                   f'size {size} is too small')
            continue
        hue[mask] = rng.uniform()
        sat[mask] = rng.uniform(0.25, 1.0)
        val[mask] = np.clip(rng.uniform(0.45, 0.7) +
                            0.3 * _texture(rng, texture, size)[mask], 0.05, 1.0)
        label_map[mask] = obj_label + 1
        polygon = None if vertices is None else tuple(
            float(v) for v in vertices.reshape(-1))
        objects.append(ToyObject(obj_label, shape, mask, polygon))
    image = np.round(_hsv_to_rgb(hue, sat, val) * 255).astype(np.uint8)
    return image, label_map, objects


def mask_to_rle(mask: np.ndarray) -> Dict[str, list]:
    """COCO uncompressed RLE of a mask (column-major runs, starting with zeros).

    Args:
        mask (np.ndarray): (height, width) bool.

    Returns:
        dict: ``{'size': [height, width], 'counts': [run lengths]}``.
    """
    flat = np.asarray(mask, bool).ravel(order='F')
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0] + counts
    return {'size': list(mask.shape), 'counts': counts}


def _bbox(mask: np.ndarray) -> List[float]:
    """Tight [x, y, width, height] of a non-empty (height, width) mask."""
    rows = np.flatnonzero(mask.any(1))
    cols = np.flatnonzero(mask.any(0))
    return [float(cols[0]), float(rows[0]), float(cols[-1] - cols[0] + 1),
            float(rows[-1] - rows[0] + 1)]


def _png_bytes(array: np.ndarray) -> bytes:
    """PNG of a uint8 (height, width) grey or (height, width, 3) RGB array."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format='PNG')
    return buffer.getvalue()


def _jpeg_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format='JPEG', quality=95)
    return buffer.getvalue()


def _write(path: str, data: bytes) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'wb') as file:
        file.write(data)


def _check_int(name: str, value, low: int, high: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            value < low or (high is not None and value > high):
        bound = f'>= {low}' if high is None else f'in [{low}, {high}]'
        raise ValueError(f'{name} must be an int {bound}, got {value!r}')


def _check_args(num_classes, train_per_class, val_per_class, size, seed,
                formats) -> Tuple[str, ...]:
    _check_int('num_classes', num_classes, 2, MAX_CLASSES)
    _check_int('train_per_class', train_per_class, 1)
    _check_int('val_per_class', val_per_class, 1)
    _check_int('size', size, 32, 4096)
    _check_int('seed', seed, 0)
    formats = (formats, ) if isinstance(formats, str) else tuple(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if not formats or unknown:
        raise ValueError(f'formats must be a non-empty subset of {FORMATS}, got '
                         f'{formats!r}')
    return tuple(f for f in FORMATS if f in formats)


def _write_split(root: str, split: str, split_id: int, names: List[str],
                 per_class: int, size: int, seed: int,
                 formats: Tuple[str, ...], style: str = 'simple',
                 placement: str = 'centred') -> None:
    """Render and write every sample of one split under ``root``."""
    render = partial(render_rich_sample, placement=placement) if style == 'rich' \
        else render_toy_sample
    ann_lines = []
    coco_images, coco_anns = [], []
    for label, name in enumerate(names):
        for i in range(per_class):
            rng = np.random.default_rng([seed, split_id, label * per_class + i])
            image, label_map, objects = render(rng, label, len(names), size)
            stem = f'{name}_{i:05d}'
            if 'imagenet' in formats:
                _write(osp.join(root, split, name, f'{stem}.png'),
                       _png_bytes(image))
                ann_lines.append(f'{name}/{stem}.png {label}\n')
                rgb_ids = np.stack([label_map % 256, label_map // 256,
                                    np.zeros_like(label_map)], -1)
                _write(osp.join(root, 'masks', split, name, f'{stem}.png'),
                       _png_bytes(rgb_ids.astype(np.uint8)))
            jpeg = _jpeg_bytes(image) if {'ade', 'coco'} & set(formats) else b''
            if 'ade' in formats:
                ade_split = ADE_SPLITS[split]
                _write(osp.join(root, 'ade', 'images', ade_split, f'{stem}.jpg'), jpeg)
                _write(osp.join(root, 'ade', 'annotations', ade_split, f'{stem}.png'),
                       _png_bytes(label_map.astype(np.uint8)))
            if 'coco' in formats:
                _write(osp.join(root, 'coco', split, f'{stem}.jpg'), jpeg)
                image_id = len(coco_images) + 1
                coco_images.append(dict(id=image_id, file_name=f'{stem}.jpg',
                                        width=size, height=size))
                for obj in objects:
                    segmentation = mask_to_rle(obj.mask) if obj.polygon is None \
                        else [list(obj.polygon)]
                    coco_anns.append(dict(
                        id=len(coco_anns) + 1, image_id=image_id,
                        category_id=obj.label + 1, bbox=_bbox(obj.mask),
                        area=float(obj.mask.sum()), iscrowd=0,
                        segmentation=segmentation))
    if 'imagenet' in formats:
        _write(osp.join(root, 'meta', f'{split}.txt'), ''.join(ann_lines).encode())
    if 'coco' in formats:
        categories = [dict(id=k + 1, name=name,
                           supercategory=name.split('_', 1)[1].split('-')[0])
                      for k, name in enumerate(names)]
        coco = dict(info=dict(description='mmdinomamba toy dataset'), licenses=[],
                    images=coco_images, annotations=coco_anns,
                    categories=categories)
        _write(osp.join(root, 'coco', 'annotations', f'instances_{split}.json'),
               json.dumps(coco).encode())


def _read_stamp(root: str) -> Optional[dict]:
    path = osp.join(root, STAMP)
    if not osp.isfile(path):
        return None
    try:
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError) as err:
        raise ValueError(f'{path} is unreadable ({err}); pass overwrite=True '
                         '(CLI: --overwrite) to regenerate the dataset') from err


def make_toy_dataset(out_dir: str,
                     num_classes: int = 4,
                     train_per_class: int = 16,
                     val_per_class: int = 4,
                     size: int = 96,
                     seed: int = 0,
                     formats: Sequence[str] = FORMATS,
                     overwrite: bool = False,
                     style: str = 'simple',
                     placement: str = 'centred') -> str:
    """Generate the toy dataset under ``out_dir`` (see the module docstring).

    The dataset is written into a temporary folder next to ``out_dir`` and renamed
    into place, so ``out_dir`` is either absent or complete. A stamp file records
    the arguments; a call whose arguments match the stamp does nothing.

    Args:
        out_dir (str): dataset root; must be absent, empty, or a toy dataset.
        num_classes (int): classes, 2..254.
        train_per_class (int): training images per class, >= 1.
        val_per_class (int): validation images per class, >= 1.
        size (int): image side in pixels, 32..4096 (default 96, a local-crop size).
        seed (int): seed, >= 0.
        formats (Sequence[str]): any of ``'imagenet'`` (folders, meta/ and
            ImageNet-S masks), ``'ade'``, ``'coco'``.
        overwrite (bool): replace an existing toy dataset made with other
            arguments (or with an unreadable stamp).
        style (str): ``'simple'`` (colour-coded shapes, the default) or
            ``'rich'`` (shape and texture classes in random colours on cluttered
            backgrounds; see the module docstring).
        placement (str): where the rich style puts its shapes
            (:data:`PLACEMENTS`): ``'centred'`` (the default, each shape inside
            the image, object pixels crowding the centre) or ``'uniform'``
            (centres anywhere, shapes cut at the border: no centre bias; the
            comparison recipe's data). The simple style has 'centred' only.

    Returns:
        str: ``out_dir``.

    Raises:
        ValueError: bad arguments, or a toy dataset with other arguments exists
            and ``overwrite`` is False.
        FileExistsError: ``out_dir`` is a non-empty folder that is not a toy
            dataset.
    """
    formats = _check_args(num_classes, train_per_class, val_per_class, size, seed,
                          formats)
    _check_style(style)
    if placement not in PLACEMENTS:
        raise ValueError(f'unknown placement {placement!r}; choose one of '
                         f'{list(PLACEMENTS)}')
    if placement != 'centred' and style != 'rich':
        raise ValueError(f"placement {placement!r} needs style='rich' (the simple "
                         "style places its shapes 'centred' only)")
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise ValueError(f'out_dir must be a non-empty path, got {out_dir!r}')
    root = osp.abspath(out_dir)
    args = dict(generator_version=GENERATOR_VERSION, num_classes=int(num_classes),
                train_per_class=int(train_per_class),
                val_per_class=int(val_per_class), size=int(size), seed=int(seed),
                formats=list(formats))
    if style != 'simple':  # simple-style stamps stay as they were before styles
        args['style'] = style
    if placement != 'centred':  # and centred ones as before placements
        args['placement'] = placement
    if osp.exists(root):
        if not osp.isdir(root):
            raise FileExistsError(f'{root} exists and is not a folder')
        try:
            stamp = _read_stamp(root)
        except ValueError:
            if not overwrite:
                raise
            stamp = {}
        if stamp == args:
            print_log(f'toy dataset at {root} is up to date', logger='current')
            return out_dir
        if stamp is None and os.listdir(root):
            raise FileExistsError(f'{root} is a non-empty folder without a '
                                  f'{STAMP} stamp; refusing to replace it')
        if stamp and not overwrite:
            differ = sorted(k for k in set(args) | set(stamp)
                            if args.get(k) != stamp.get(k))
            raise ValueError(f'{root} holds a toy dataset made with other '
                             f'arguments (differ: {differ}); pass '
                             'overwrite=True (CLI: --overwrite) to regenerate it')
    parent = osp.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f'.{osp.basename(root)}.tmp-', dir=parent)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a dataset is shared
        names = toy_class_names(num_classes, style)
        _write(osp.join(tmp, 'classes.txt'), ''.join(f'{n}\n' for n in names).encode())
        for split_id, (split, per_class) in enumerate(
                zip(SPLITS, (train_per_class, val_per_class))):
            _write_split(tmp, split, split_id, names, per_class, size, seed, formats,
                         style, placement)
        _write(osp.join(tmp, STAMP), json.dumps(args, sort_keys=True).encode())
        _swap_into_place(tmp, root)
    finally:
        if osp.exists(tmp):
            shutil.rmtree(tmp)
    print_log(f'toy dataset written to {root} ({style} style, {placement} '
              f'placement, {num_classes} classes, '
              f'{train_per_class}/{val_per_class} train/val images per class, '
              f'{size} px, formats {list(formats)})', logger='current')
    return out_dir


def _swap_into_place(tmp: str, root: str) -> None:
    """Rename the finished ``tmp`` to ``root``, moving an old ``root`` aside first."""
    old = None
    if osp.exists(root):
        old = tempfile.mkdtemp(prefix=f'.{osp.basename(root)}.old-',
                               dir=osp.dirname(root))
        os.rmdir(old)
        os.rename(root, old)
    try:
        os.rename(tmp, root)
    except OSError:
        if old is not None:
            os.rename(old, root)
        raise
    if old is not None:
        shutil.rmtree(old)
