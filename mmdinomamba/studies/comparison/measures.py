"""Frozen-feature measures of a backbone on an image split: k-NN and Binary-AUC.

The engine shared by ``tools/run_demo.py`` (DINO teacher against random init) and
``tools/analysis/compare_mixers.py`` (several models side by side). For each
image of a split and each requested block it keeps

- the readout feature r (the [CLS] token, or the register mean: the backbone's
  ``cls_token`` output at the last block), (dim,);
- the Binary-AUC (:func:`mmdinomamba.evaluation.binary_auc`, exact, the
  default of :class:`~mmdinomamba.evaluation.BinaryAUC`) of each kind of
  activation map asked for (``map_methods``,
  :mod:`mmdinomamba.analysis.activation_maps`: the 'cosine' map of the readout
  against the patches, or the 'attention' map, the
  readout's row of the mixing matrix) of every head and of the head-mean map,
  upsampled bilinearly to the image, against the image's foreground (label not in
  ``background_indices``, default 0; ``ignore_index`` pixels left out).

k-NN accuracy (:func:`mmdinomamba.evaluation.knn_accuracy`) classifies the
validation readouts of a block against the training readouts of the same block.
Every number is kept per image, so :func:`mmdinomamba.evaluation.bootstrap_ci`
gives its interval over images.

Images are read from an ImageNet-style split (an annotation file of
``<relative path> <class id>`` lines under a data prefix), with optional RGB or
grey label-map PNGs at the same relative paths under a mask prefix (the toy
generator's ``masks/<split>/`` and ImageNet-S's layout). Each image and its label
map are resized (short side, bicubic / nearest) and centre-cropped to one size.
"""
import os
import os.path as osp
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from mmengine.utils import ProgressBar

from mmdinomamba.evaluation import binary_auc_batch, foreground_mask, knn_accuracy
from mmdinomamba.analysis.activation_maps import (METHODS, activation_maps,
                                                  cosine_similarity_maps,
                                                  intermediate_attention_rows,
                                                  upsample_maps)
from mmdinomamba.analysis.adapters import as_backbone, eval_no_grad, normalise_layers
from mmdinomamba.analysis.images import DEFAULT_PREPROCESSOR
from mmdinomamba.analysis.mixing import mixer_info

Tensor = torch.Tensor

__all__ = ['ImageSplit', 'Measurement', 'ModelSpec', 'centred_gaussian_map',
           'compare_models', 'fixed_map_aucs', 'grey_image_maps', 'load_model',
           'load_split', 'map_aucs', 'measure_backbone', 'knn_hits', 'order_word',
           'paired_gain', 'paired_gains', 'preprocess_image', 'preprocess_label_map',
           'probe_hits', 'rank_by_layer', 'repo_relative']


@dataclass
class ImageSplit:
    """Preprocessed images of one split.

    Attributes:
        images (Tensor): (num_images, 3, size, size) float32, normalised.
        labels (Tensor): (num_images,) int64 class ids.
        label_maps (Tensor, optional): (num_images, size, size) int64, 0 =
            background; None when the split has no masks.
        paths (list[str]): the images' paths relative to the data prefix.
    """
    images: Tensor
    labels: Tensor
    label_maps: Optional[Tensor]
    paths: List[str]

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class Measurement:
    """Per-image measures of one backbone on one split.

    Attributes:
        readouts (dict): block index -> (num_images, dim) float32 readout features.
        aucs (dict, optional): map method -> block index -> (num_images, heads + 1)
            float64 Binary-AUC of each head's map then of the head-mean map (nan
            for an image without foreground or background); None without maps.
    """
    readouts: Dict[int, Tensor]
    aucs: Optional[Dict[str, Dict[int, np.ndarray]]]


def _resized_box(h: int, w: int, size: int):
    """Resized (width, height) with the short side at ``size``, and the centre crop
    box (left, top, right, bottom) of ``size`` x ``size`` in it."""
    scale = size / min(h, w)
    new = (max(size, round(w * scale)), max(size, round(h * scale)))
    left, top = (new[0] - size) // 2, (new[1] - size) // 2
    return new, (left, top, left + size, top + size)


def preprocess_image(image: np.ndarray, size: int) -> Tensor:
    """uint8 RGB (height, width, 3) -> normalised (3, size, size) float32.

    The shorter side goes to ``size`` (bicubic), then a centre crop; normalised
    with mmpretrain's ImageNet mean and std (0-255 scale).
    """
    from PIL import Image
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f'expected a uint8 RGB image (height, width, 3), got '
                         f'{image.dtype} {image.shape}')
    new, box = _resized_box(*image.shape[:2], size)
    pil = Image.fromarray(image)
    if new != pil.size:
        pil = pil.resize(new, Image.BICUBIC)
    array = np.asarray(pil.crop(box), np.float32)
    mean = np.array(DEFAULT_PREPROCESSOR['mean'], np.float32)
    std = np.array(DEFAULT_PREPROCESSOR['std'], np.float32)
    return torch.from_numpy((array - mean) / std).permute(2, 0, 1).contiguous()


def preprocess_label_map(ids: np.ndarray, size: int) -> Tensor:
    """A (height, width) label map with the geometry of :func:`preprocess_image`.

    The shorter side goes to ``size`` (nearest neighbour), then a centre crop.

    Returns:
        Tensor: (size, size) int64.
    """
    from PIL import Image
    if ids.ndim != 2:
        raise ValueError(f'a label map must be (height, width), got {ids.shape}')
    new, box = _resized_box(*ids.shape, size)
    pil = Image.fromarray(ids.astype(np.int32))
    if new != pil.size:
        pil = pil.resize(new, Image.NEAREST)
    return torch.from_numpy(np.asarray(pil.crop(box), np.int64).copy())


def load_split(data_root: str,
               ann_file: str,
               data_prefix: str,
               size: int,
               mask_prefix: Optional[str] = None,
               limit: Optional[int] = None) -> ImageSplit:
    """Read and preprocess an ImageNet-style split (see the module docstring).

    Args:
        data_root (str): dataset root.
        ann_file (str): annotation file relative to ``data_root``; each line is
            ``<path relative to data_prefix> <class id>``.
        data_prefix (str): image folder relative to ``data_root``.
        size (int): side of the preprocessed images (and label maps).
        mask_prefix (str, optional): label-map folder relative to ``data_root``
            (PNG at the image's relative path, extension ``.png``); None = no masks.
        limit (int, optional): keep only ``limit`` lines, evenly spaced over
            the file (line ``i * n // limit`` for i < limit, of n), so that a
            file sorted by class keeps every class.

    Returns:
        ImageSplit: the split.
    """
    from PIL import Image

    from mmdinomamba.datasets import read_label_map
    ann = osp.join(data_root, ann_file)
    if not osp.isfile(ann):
        raise FileNotFoundError(f'annotation file {ann!r} does not exist')
    with open(ann) as f:
        lines = [line.split() for line in f if line.strip()]
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f'limit must be a positive int, got {limit!r}')
        lines = [lines[i * len(lines) // limit]
                 for i in range(min(limit, len(lines)))]
    if not lines:
        raise ValueError(f'{ann} lists no images')
    images, labels, maps, paths = [], [], [], []
    for fields in lines:
        if len(fields) != 2:
            raise ValueError(f'{ann}: expected "<path> <class id>" lines, got '
                             f'{" ".join(fields)!r}')
        rel, label = fields
        with Image.open(osp.join(data_root, data_prefix, rel)) as image:
            images.append(preprocess_image(np.asarray(image.convert('RGB')), size))
        labels.append(int(label))
        paths.append(rel)
        if mask_prefix is not None:
            mask = osp.join(data_root, mask_prefix, osp.splitext(rel)[0] + '.png')
            if not osp.isfile(mask):
                raise FileNotFoundError(f'no label map {mask!r} for image {rel!r}')
            maps.append(preprocess_label_map(read_label_map(mask), size))
    return ImageSplit(torch.stack(images), torch.tensor(labels),
                      torch.stack(maps) if maps else None, paths)


def _num_heads(api, index: int, dim: int) -> int:
    """Heads of block ``index``'s mixer (1 when they do not divide the width)."""
    heads = mixer_info(api.token_mixer(index)).nheads
    return heads if dim % heads == 0 else 1


def _intermediates(api, images: Tensor, indices: Sequence[int],
                   mixer_inputs: bool = False):
    """``forward_intermediates`` in eval mode without gradients."""
    with eval_no_grad(api):
        return api.forward_intermediates(images, indices, mixer_inputs=mixer_inputs)


def map_aucs(maps: Tensor, label_maps: Tensor,
             background_indices: Sequence[int] = (0, ),
             ignore_index: Optional[int] = 255) -> np.ndarray:
    """Exact Binary-AUC of each map of each image.

    Args:
        maps (Tensor): (batch, num_maps, height, width), the label maps' size.
        label_maps (Tensor): (batch, height, width) class ids.
        background_indices (Sequence[int]): labels merged into background.
        ignore_index (int, optional): label in neither class.

    Returns:
        np.ndarray: (batch, num_maps) float64, nan for an image whose valid
        foreground or background is empty.
    """
    fg, valid = foreground_mask(label_maps.to(maps.device), background_indices,
                                ignore_index)
    return binary_auc_batch(maps, fg, valid).cpu().numpy()


def measure_backbone(backbone: nn.Module,
                     split: ImageSplit,
                     layers: Optional[Sequence[int]] = None,
                     with_maps: bool = True,
                     batch_size: int = 32,
                     device: str = 'cpu',
                     progress: bool = False,
                     map_methods: Sequence[str] = ('cosine', ),
                     label: str = 'images') -> Measurement:
    """Readout features and Binary-AUCs of every image at every requested block.

    Args:
        backbone (nn.Module): DinoVim, LinearViT or mmpretrain VisionTransformer;
            it is moved to ``device`` and run in eval mode without gradients.
        split (ImageSplit): the images (and label maps).
        layers (Sequence[int], optional): block indices, negative from the end;
            None = every block.
        with_maps (bool): score activation maps (needs ``split.label_maps``).
        batch_size (int): images per forward pass. Defaults to 32.
        device (str): 'cpu' or 'cuda[:i]'. Defaults to 'cpu'.
        progress (bool): report progress over the images: an mmengine
            ProgressBar on a terminal, else a line at each quarter
            (``<label> 500/2000 [35 s]``), so that a log or a pipe shows it too.
        map_methods (Sequence[str]): activation maps to score, each of
            ``activation_maps.METHODS``. Defaults to ('cosine', ).
        label (str): what the progress lines call the images.

    Returns:
        Measurement: readouts (float32, on the CPU) and AUCs per method and block.
    """
    if with_maps and split.label_maps is None:
        raise ValueError('with_maps=True needs a split with label maps (mask_prefix)')
    _check_methods(map_methods)
    backbone = backbone.to(device)
    api = as_backbone(backbone)
    depth = api.num_layers
    indices = normalise_layers(range(depth) if layers is None else layers, depth)
    readouts: Dict[int, List[Tensor]] = {i: [] for i in indices}
    aucs = {m: {i: [] for i in indices} for m in map_methods}
    attention = with_maps and 'attention' in map_methods
    bar = ProgressBar(len(split)) if progress and sys.stdout.isatty() else None
    lines, began, next_line = progress and bar is None, time.time(), len(split) / 4
    for start in range(0, len(split), batch_size):
        x = split.images[start:start + batch_size].to(device)
        # one forward pass: the tokens, and the mixer inputs the attention maps need
        out = _intermediates(api, x, indices, mixer_inputs=attention)
        grids = _map_grids(api, out, indices, map_methods if with_maps else (),
                           readouts)
        for method in (map_methods if with_maps else ()):
            for i, grid in grids[method].items():
                maps = upsample_maps(grid.float(), x.shape[-2:])
                maps = torch.cat([maps, maps.mean(dim=1, keepdim=True)], dim=1)
                aucs[method][i].append(
                    map_aucs(maps, split.label_maps[start:start + batch_size]))
        if bar is not None:
            for _ in range(x.shape[0]):
                bar.update()
        done = start + x.shape[0]
        if lines and (done >= next_line or done == len(split)):
            print(f'      {label} {done}/{len(split)} [{time.time() - began:.0f} s]',
                  flush=True)
            next_line = (done // (len(split) / 4) + 1) * len(split) / 4
    if bar is not None:
        print()
    return Measurement({i: torch.cat(v) for i, v in readouts.items()},
                       {m: {i: np.concatenate(v) for i, v in a.items()}
                        for m, a in aucs.items()} if with_maps else None)


def _map_grids(api, out, indices: Sequence[int], methods: Sequence[str],
               readouts: Optional[Dict[int, List[Tensor]]] = None
               ) -> Dict[str, Dict[int, Tensor]]:
    """Each method's per-head maps on the patch grid, per block, from one
    ``forward_intermediates`` output: method -> block -> (batch, heads, h, w);
    the readout of each block is appended to ``readouts`` when given."""
    grids = {'cosine': {}}
    for i, t in out.features.items():
        layout = out.layout_of(i)
        readout = t[:, layout.readout].mean(dim=1).float()
        if readouts is not None:
            readouts[i].append(readout.cpu())
        if 'cosine' in methods:
            grids['cosine'][i] = cosine_similarity_maps(
                readout, t[:, layout.patches].float(), layout.hw,
                _num_heads(api, i, t.shape[-1]))
    if 'attention' in methods:
        grids['attention'] = intermediate_attention_rows(api, out, indices)
    return grids


def centred_gaussian_map(size: int, sigma: float = 0.25) -> Tensor:
    """The centre prior: a fixed Gaussian bump at the image centre, standard
    deviation ``sigma`` times the side, (size, size) float32."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size - 0.5
    return torch.exp(-(c[:, None] ** 2 + c[None, :] ** 2) / (2 * sigma ** 2))


def fixed_map_aucs(maps: Tensor, label_maps: Tensor, chunk: int = 64) -> np.ndarray:
    """Binary-AUC of the same maps (num_maps, h, w) against every image's label
    map (num_images, h, w): (num_images, num_maps) float64, nan where an image
    has no foreground or no background."""
    out = []
    for start in range(0, len(label_maps), chunk):
        part = label_maps[start:start + chunk]
        out.append(map_aucs(maps[None].expand(len(part), -1, -1, -1).contiguous(),
                            part))
    return np.concatenate(out)


def grey_image_maps(backbone: nn.Module, size: int, layer: int,
                    methods: Sequence[str], device: str = 'cpu') -> Dict[str, Tensor]:
    """The maps of a flat grey image (RGB 128, normalised as every image) through
    the network: method -> (heads + 1, size, size), each head's map then the
    head-mean map, at block ``layer``. What a map shows without any content."""
    api = as_backbone(backbone)
    grey = preprocess_image(np.full((size, size, 3), 128, np.uint8), size)[None]
    out = _intermediates(api, grey.to(device), [layer],
                         mixer_inputs='attention' in methods)
    grids = _map_grids(api, out, [layer], methods)
    result = {}
    for method in methods:
        maps = upsample_maps(grids[method][layer].float(), (size, size))[0]
        result[method] = torch.cat([maps, maps.mean(dim=0, keepdim=True)]).cpu()
    return result


def _check_methods(methods: Sequence[str]) -> None:
    if isinstance(methods, str) or not methods or len(set(methods)) != len(methods) \
            or any(m not in METHODS for m in methods):
        raise ValueError(f'map_methods must be distinct names from {METHODS}, '
                         f'got {methods!r}')


def knn_hits(train: Measurement, train_labels: Tensor, val: Measurement,
             val_labels: Tensor, layer: int, k: int = 20,
             temperature: float = 0.07) -> np.ndarray:
    """Per-image k-NN correctness of the validation readouts of one block.

    Returns:
        np.ndarray: (num_val,) float64, 1.0 = right.
    """
    if layer not in train.readouts or layer not in val.readouts:
        raise ValueError(f'block {layer} was not measured; measured: '
                         f'{sorted(val.readouts)}')
    return knn_accuracy(train.readouts[layer], train_labels, val.readouts[layer],
                        val_labels, k, temperature).numpy()


# --------------------------------------------------------------------------- #
# Several models side by side
# --------------------------------------------------------------------------- #
@dataclass
class ModelSpec:
    """One model of a comparison.

    Attributes:
        name (str): its name in the report.
        config (str): config file whose ``model.backbone`` (or ``model``) builds
            the backbone.
        checkpoint (str, optional): backbone weights (a teacher extracted with
            ``tools/model_converters/extract_teacher.py``, an mmengine or an
            official checkpoint); None = random initialisation.
        probe_config (str, optional): linear-probe config (an mmpretrain
            ``ImageClassifier`` on this backbone).
        probe_checkpoint (str, optional): the trained probe (the whole
            classifier, as ``tools/train.py`` saves it); needs ``probe_config``.
        cfg_options (dict, optional): overrides merged into ``config`` (as
            ``--cfg-options``), e.g. ``{'model.backbone.arch.num_layers': 2}``.
    """
    name: str
    config: str
    checkpoint: Optional[str] = None
    probe_config: Optional[str] = None
    probe_checkpoint: Optional[str] = None
    cfg_options: Optional[dict] = None


def _config(path: str, what: str):
    from mmengine.config import Config
    if not osp.isfile(path):
        raise FileNotFoundError(f'{what} config {path!r} does not exist')
    try:
        return Config.fromfile(path)
    except Exception as err:  # mmengine raises several types for a broken file
        raise ValueError(f'{what} config {path!r} could not be read: {err}') from err


def load_model(spec: ModelSpec, seed: int = 0) -> nn.Module:
    """The backbone of ``spec`` through :func:`mmdinomamba.analysis.load_backbone`:
    built from its config (without the config's own ``init_cfg``), initialised
    under ``seed``, then filled strictly from its checkpoint if it has one.

    Raises:
        FileNotFoundError: the config or the checkpoint does not exist.
        ValueError: the config builds no backbone, or the checkpoint does not fit.
    """
    from mmdinomamba.analysis.loading import backbone_config, load_backbone
    config = _config(spec.config, f'model {spec.name!r}:')
    if spec.cfg_options:
        config.merge_from_dict(spec.cfg_options)
    cfg = backbone_config(config)
    cfg.pop('init_cfg', None)
    if spec.checkpoint is not None and not osp.isfile(spec.checkpoint):
        raise FileNotFoundError(f'model {spec.name!r}: checkpoint '
                                f'{spec.checkpoint!r} does not exist')
    torch.manual_seed(seed)
    try:
        backbone = load_backbone(dict(model=cfg, default_scope=config.get(
            'default_scope') or 'mmpretrain'))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f'model {spec.name!r}: {spec.config} does not build a '
                         f'backbone ({type(err).__name__}: {err})') from err
    if spec.checkpoint is not None:
        from mmdinomamba.utils import allow_mmengine_checkpoint_types
        from mmdinomamba.models.checkpoint import load_backbone_checkpoint
        allow_mmengine_checkpoint_types()
        try:
            load_backbone_checkpoint(backbone, spec.checkpoint)
        except (ValueError, RuntimeError, KeyError) as err:
            raise ValueError(f'model {spec.name!r}: checkpoint {spec.checkpoint} '
                             f'does not fit the backbone of {spec.config}: {err}'
                             ) from err
    backbone.eval()  # not chained: mmpretrain's ViT.train returns None
    return backbone


def probe_hits(spec: ModelSpec, split: ImageSplit, batch_size: int = 32,
               device: str = 'cpu') -> np.ndarray:
    """Per-image top-1 correctness of the model's trained linear probe.

    The probe config's ``model`` (an mmpretrain classifier) is built without its
    backbone ``init_cfg`` and filled strictly from ``probe_checkpoint``; the split's
    images (already normalised) go straight into it.

    Returns:
        np.ndarray: (num_images,) float64, 1.0 = right.
    """
    if spec.probe_config is None or spec.probe_checkpoint is None:
        raise ValueError(f'model {spec.name!r}: a probe needs both probe_config and '
                         'probe_checkpoint')
    from mmpretrain.registry import MODELS

    import mmdinomamba  # noqa: F401  registers our classes into mmpretrain
    from mmdinomamba.utils import allow_mmengine_checkpoint_types, load_checkpoint_file
    cfg = _config(spec.probe_config, f'model {spec.name!r}: probe').model
    cfg.backbone.pop('init_cfg', None)
    cfg.pop('data_preprocessor', None)
    model = MODELS.build(cfg)
    if not osp.isfile(spec.probe_checkpoint):
        raise FileNotFoundError(f'model {spec.name!r}: probe checkpoint '
                                f'{spec.probe_checkpoint!r} does not exist')
    from mmdinomamba.models.checkpoint import (checkpoint_state_dict,
                                               load_model_state)
    allow_mmengine_checkpoint_types()
    try:  # shapes, keys and finiteness checked; nothing loaded if one fails
        checkpoint = load_checkpoint_file(spec.probe_checkpoint, map_location='cpu')
        load_model_state(model, checkpoint_state_dict(checkpoint,
                                                      spec.probe_checkpoint),
                         strict=True, source=spec.probe_checkpoint)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f'model {spec.name!r}: probe checkpoint '
                         f'{spec.probe_checkpoint} does not fit {spec.probe_config}: '
                         f'{err}') from err
    model = model.to(device)
    model.eval()
    hits = []
    with torch.no_grad():
        for start in range(0, len(split), batch_size):
            logits = model(split.images[start:start + batch_size].to(device),
                           mode='tensor')
            if isinstance(logits, (tuple, list)):
                logits = logits[-1]
            hits.append((logits.argmax(dim=1).cpu() ==
                         split.labels[start:start + batch_size]).double())
    return torch.cat(hits).numpy()


def _rank_key(kind: str, keys: Sequence[str]) -> str:
    """The matrix a layer is ranked by: the whole bidirectional SSD matrix
    ('combined'), MLLA's whole matrix ('whole', attention plus local terms) or
    the attention matrix."""
    for whole in ('combined', 'whole'):
        if whole in keys:
            return whole
    return keys[0]


def rank_by_layer(backbone: nn.Module, images: Tensor, chunk: int,
                  device: str = 'cpu', progress: bool = False) -> List[dict]:
    """Mixing-matrix ranks of every block, per image, next to the paper's bounds.

    Reuses :func:`mmdinomamba.analysis.mixing_rank.analyse_backbone` (float64
    materialised matrices, the numerical rank of :mod:`mmdinomamba.analysis.rank`).

    Returns:
        list[dict]: one per block: ``layer``, ``kind``, ``key`` (the matrix),
        per-image means over heads ``rank``, ``effective_rank`` and
        ``offdiag_rank_max`` (lists, image order), and the summary's
        ``global_bound``, ``offdiag_bound_algebra``, ``offdiag_bound_paper``,
        ``seqlen``, ``chunk``, ``nheads``, ``d_qk``, ``within_bounds``.
    """
    from mmdinomamba.analysis.mixing_rank import analyse_backbone
    report = analyse_backbone(backbone, images, chunk=chunk, device=device,
                              progress=progress)
    rows = []
    for layer in report.meta['layers']:
        summaries = [s for s in report.summary if s['layer'] == layer]
        key = _rank_key(summaries[0]['kind'], [s['key'] for s in summaries])
        summary = next(s for s in summaries if s['key'] == key)
        per_image = {name: [] for name in ('rank', 'effective_rank',
                                           'offdiag_rank_max')}
        for image in range(len(images)):
            recs = [r for r in report.records if r['layer'] == layer and
                    r['key'] == key and r['image'] == image]
            for name in per_image:
                per_image[name].append(float(np.mean([r[name] for r in recs])))
        rows.append(dict(layer=layer, kind=summary['kind'], key=key, **per_image,
                         **{k: summary[k] for k in (
                             'global_bound', 'offdiag_bound_algebra',
                             'offdiag_bound_paper', 'seqlen', 'chunk', 'nheads',
                             'd_qk', 'within_bounds')}))
    return rows


def compare_models(specs: Sequence[ModelSpec],
                   train: ImageSplit,
                   val: ImageSplit,
                   k: int = 20,
                   temperature: float = 0.07,
                   rank_images: int = 2,
                   chunk: int = 16,
                   num_resamples: int = 1000,
                   seed: int = 0,
                   batch_size: int = 32,
                   device: str = 'cpu',
                   progress: bool = True,
                   map_methods: Sequence[str] = ('cosine', ),
                   layers: Optional[Sequence[int]] = None,
                   references: bool = True,
                   prior_sigma: float = 0.25) -> dict:
    """Measure every model on the same images; the content of the report.

    Args:
        specs (Sequence[ModelSpec]): the models (names must differ).
        train (ImageSplit): the k-NN bank.
        val (ImageSplit): held-out images with label maps.
        k (int): k-NN neighbours. Defaults to 20.
        temperature (float): k-NN vote temperature. Defaults to 0.07.
        rank_images (int): validation images whose mixing matrices are ranked
            (0 = no ranks). Defaults to 2.
        chunk (int): block size c of the off-diagonal ranks. Defaults to 16.
        num_resamples (int): bootstrap resamples. Defaults to 1000.
        seed (int): model initialisation and bootstrap seed. Defaults to 0.
        batch_size (int): images per forward pass. Defaults to 32.
        device (str): 'cpu' or 'cuda[:i]'. Defaults to 'cpu'.
        progress (bool): mmengine progress bars. Defaults to True.
        map_methods (Sequence[str]): the activation maps scored by Binary-AUC
            (``activation_maps.METHODS``); the first is the headline one.
            Defaults to ('cosine', ).
        layers (Sequence[int], optional): the blocks measured for k-NN and
            Binary-AUC, negative from the end (e.g. ``[-1]``: the last one
            only); None = every block. Ranks cover every block regardless.
        references (bool): score the reference maps beside each model's
            (below). Defaults to True.
        prior_sigma (float): the centre prior's standard deviation, a fraction
            of the image side. Defaults to 0.25.

    The reference maps, scored against the same masks as the models' maps:
    the centre prior (:func:`centred_gaussian_map`, the same map for every
    image: what a map scores from the data's centre bias alone), and for each
    model the maps of a flat grey image through the same network
    (:func:`grey_image_maps`: what it shows with no content). Each model's
    last-block AUC gets its paired gain over both.

    Returns:
        dict: ``meta`` and ``models``: one dict per model with ``knn`` (last
        block, a :class:`BootstrapCI` dict), ``knn_by_layer``, ``probe`` (or
        None), ``auc_by_method`` (method -> per block: ``auc`` mean over heads,
        ``mean_map_auc``, ``heads``), ``auc_by_layer`` (that of the first
        method), ``ranks`` (:func:`rank_by_layer`) and ``map_images`` (the
        head-mean maps of the first method on the first validation images at the
        last block, (num, size, size) float32, for the figure) and ``per_image``
        (the last block's values behind ``knn`` and each method's ``auc``, one per
        validation image in order: ``knn`` (num_val,) 0/1 hits and ``auc`` method
        -> (num_val,), nan where an image has no foreground or no background; for
        paired comparisons, :func:`paired_gain`; ``auc_grey``: the grey
        image's maps' AUC on each image). With ``references``: each model's
        ``reference`` (method -> ``grey`` (the grey image's maps' AUC, mean
        over heads), ``gain_over_grey``, ``gain_over_prior``: paired
        BootstrapCI dicts), and ``reference`` at the top (``centred_gaussian``:
        ``sigma``, ``auc``, ``per_image``). ``map_images`` stays out of
        ``report.json``; the per-image values go in, so every paired
        statistic can be recomputed from it.
    """
    from mmdinomamba.evaluation import bootstrap_ci
    names = [s.name for s in specs]
    if not specs or len(set(names)) != len(names):
        raise ValueError(f'give one or more models with distinct names, got {names}')
    if val.label_maps is None:
        raise ValueError('the validation split needs label maps (mask_prefix) for '
                         'Binary-AUC')
    _check_methods(map_methods)

    def ci(values):
        return bootstrap_ci(values, num_resamples=num_resamples, seed=seed).as_dict()

    size = val.images.shape[-1]
    reference = None
    if references:
        prior = fixed_map_aucs(centred_gaussian_map(size, prior_sigma)[None],
                               val.label_maps)[:, 0]
        reference = dict(centred_gaussian=dict(sigma=prior_sigma, auc=ci(prior),
                                               per_image=prior))
    models = []
    for spec in specs:
        print(f'[{spec.name}] {spec.config} '
              f'({spec.checkpoint or "random init"})', flush=True)
        backbone = load_model(spec, seed)
        train_m = measure_backbone(backbone, train, layers, with_maps=False,
                                   batch_size=batch_size, device=device,
                                   progress=progress,
                                   label=f'{spec.name}: k-NN bank images')
        val_m = measure_backbone(backbone, val, layers, batch_size=batch_size,
                                 device=device, progress=progress,
                                 map_methods=map_methods,
                                 label=f'{spec.name}: held-out images (features '
                                 'and maps)')
        measured = sorted(val_m.readouts)  # this model's blocks
        hits = {i: knn_hits(train_m, train.labels, val_m, val.labels, i, k,
                            temperature) for i in measured}
        knn_by_layer = {i: ci(h) for i, h in hits.items()}
        # per image: the mean over heads of each head's AUC
        head_mean_auc = {method: {i: np.nanmean(a[:, :-1], axis=1)
                                  for i, a in by_layer.items()}
                         for method, by_layer in val_m.aucs.items()}
        auc_by_method = {}
        for method, by_layer in val_m.aucs.items():
            auc_by_method[method] = [dict(
                layer=i, auc=ci(head_mean_auc[method][i]),
                mean_map_auc=ci(a[:, -1]),
                heads=[float(np.nanmean(a[:, h])) for h in range(a.shape[1] - 1)])
                for i, a in sorted(by_layer.items())]
        probe = None
        if spec.probe_config is not None or spec.probe_checkpoint is not None:
            probe = ci(probe_hits(spec, val, batch_size, device))
        ranks = []
        if rank_images > 0:
            ranks = rank_by_layer(backbone, val.images[:rank_images].to(device),
                                  chunk, device, progress)
            for row in ranks:
                for name in ('rank', 'effective_rank', 'offdiag_rank_max'):
                    row[f'{name}_ci'] = ci(row[name])
        last_maps = measure_maps(backbone, val.images[:4].to(device), map_methods[0])
        last = measured[-1]
        per_image = dict(knn=hits[last],
                         auc={m: a[last] for m, a in head_mean_auc.items()})
        model_reference = None
        if references:
            grey = grey_image_maps(backbone, size, last, map_methods, device)
            per_image['auc_grey'], model_reference = {}, {}
            for method in map_methods:
                grey_auc = np.nanmean(fixed_map_aucs(grey[method], val.label_maps)
                                      [:, :-1], axis=1)
                own = head_mean_auc[method][last]
                per_image['auc_grey'][method] = grey_auc
                model_reference[method] = dict(
                    grey=ci(grey_auc), gain_over_grey=ci(own - grey_auc),
                    gain_over_prior=ci(own - reference['centred_gaussian']
                                       ['per_image']))
        models.append(dict(
            name=spec.name, config=repo_relative(spec.config),
            checkpoint=repo_relative(spec.checkpoint),
            probe_config=repo_relative(spec.probe_config),
            probe_checkpoint=repo_relative(spec.probe_checkpoint),
            type=type(backbone).__name__, depth=as_backbone(backbone).num_layers,
            kind=mixer_info(as_backbone(backbone).token_mixer(0)).kind,
            knn=knn_by_layer[measured[-1]], knn_by_layer=knn_by_layer, probe=probe,
            auc_by_method=auc_by_method, auc_by_layer=auc_by_method[map_methods[0]],
            ranks=ranks, map_images=last_maps, per_image=per_image,
            reference=model_reference))
        backbone.cpu()
    meta = dict(num_train=len(train), num_val=len(val), image_size=list(
        val.images.shape[-2:]), k=k, temperature=temperature, rank_images=rank_images,
        chunk=chunk, num_resamples=num_resamples, seed=seed, level=0.95,
        device=device, map_paths=val.paths[:4], map_methods=list(map_methods),
        val_paths=list(val.paths))
    out = dict(meta=meta, models=models)
    if reference is not None:
        out['reference'] = reference
    return out


def repo_relative(path: Optional[str]) -> Optional[str]:
    """``path`` as a report shows it: relative to the current folder when it
    lies inside it, else its last two components (a report holds no absolute
    path of the machine that made it)."""
    if path is None:
        return None
    rel = osp.relpath(osp.abspath(path))
    if not rel.startswith('..'):
        return rel
    parts = osp.normpath(osp.abspath(path)).split(os.sep)
    return '/'.join(parts[-2:])


def paired_gain(base: dict, other: dict, measure: str = 'knn',
                num_resamples: int = 1000, seed: int = 0):
    """How much ``other`` beats ``base`` on the same validation images.

    The per-image difference ``other - base`` of ``measure`` at the last block
    (k-NN hits, or the head-mean Binary-AUC of the map method ``measure``), its
    mean and percentile bootstrap interval: the images are resampled together,
    so what is hard or easy for both models cancels, and the interval is
    narrower than the two models' own intervals side by side. Images where
    either value is nan are left out.

    Args:
        base (dict), other (dict): two entries of ``compare_models(...)['models']``
            measured on the same validation split.
        measure (str): ``'knn'`` or a map method of both (e.g. ``'attention'``).
        num_resamples (int): bootstrap resamples. Defaults to 1000.
        seed (int): bootstrap seed. Defaults to 0.

    Returns:
        BootstrapCI: the mean difference (a fraction for k-NN) and its interval.
    """
    from mmdinomamba.evaluation import bootstrap_ci

    def values(model):
        per_image = model['per_image']
        if measure == 'knn':
            return per_image['knn']
        if measure not in per_image['auc']:
            raise ValueError(f'{model["name"]!r} has no {measure!r} map; measured: '
                             f'knn, {", ".join(per_image["auc"])}')
        return per_image['auc'][measure]

    a, b = values(base), values(other)
    if a.shape != b.shape:
        raise ValueError(f'{base["name"]!r} and {other["name"]!r} were measured on '
                         f'different images ({a.size} and {b.size} values)')
    return bootstrap_ci(b - a, num_resamples=num_resamples, seed=seed)


def paired_gains(results: dict, pairs: Sequence[Sequence[str]],
                 num_resamples: int = 1000, seed: int = 0) -> List[dict]:
    """:func:`paired_gain` for named pairs of the models of ``results``.

    Args:
        results (dict): the output of :func:`compare_models`.
        pairs (Sequence[Sequence[str]]): ``(model, base)`` names, e.g. a DINO
            teacher and the weights its run started from.
        num_resamples (int): bootstrap resamples. Defaults to 1000.
        seed (int): bootstrap seed. Defaults to 0.

    Returns:
        list[dict]: per pair ``model``, ``base``, ``knn`` (a BootstrapCI dict of
        the k-NN gain) and ``auc`` (map method -> the Binary-AUC gain), last
        block, and ``order``: measure -> :func:`order_word` of its gain.
    """
    models = {m['name']: m for m in results['models']}
    out = []
    for name, base in pairs:
        for n in (name, base):
            if n not in models:
                raise ValueError(f'pair ({name}, {base}): no model {n!r}; models: '
                                 f'{sorted(models)}')
        a, b = models[base], models[name]
        knn = paired_gain(a, b, 'knn', num_resamples, seed).as_dict()
        auc = {m: paired_gain(a, b, m, num_resamples, seed).as_dict()
               for m in results['meta']['map_methods']}
        order = dict(knn=order_word(knn), **{m: order_word(g) for m, g in auc.items()})
        out.append(dict(model=name, base=base, knn=knn, auc=auc, order=order))
    return out


def order_word(gain: dict) -> str:
    """'better' or 'worse' where a gain's interval lies above or below 0,
    'tie' where it includes 0: an order only where the interval decides it."""
    if gain['low'] > 0:
        return 'better'
    if gain['high'] < 0:
        return 'worse'
    return 'tie'


def measure_maps(backbone: nn.Module, images: Tensor,
                 method: str = 'cosine') -> np.ndarray:
    """Head-mean activation maps (``method``) of the last block, image size.

    Returns:
        np.ndarray: (num_images, height, width) float32.
    """
    api = as_backbone(backbone)
    last = api.num_layers - 1
    if method == 'attention':
        maps = activation_maps(backbone, images, last, 'attention').mean
        return maps.float().cpu().numpy()
    out = _intermediates(api, images, [last])
    t, layout = out.features[last].float(), out.layout_of(last)
    readout = t[:, layout.readout].mean(dim=1)
    grid = cosine_similarity_maps(readout, t[:, layout.patches], layout.hw,
                                  _num_heads(api, last, t.shape[-1]))
    return upsample_maps(grid, images.shape[-2:]).mean(dim=1).cpu().numpy()
