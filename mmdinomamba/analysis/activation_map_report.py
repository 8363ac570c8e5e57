"""Pictures and per-layer numbers of activation maps against label maps.

The engine of ``tools/analysis/activation_maps.py`` (:func:`write_report`): it
feeds dataset samples
through an :class:`~mmdinomamba.analysis.ActivationMapModel`, scores the maps of
every layer with :class:`~mmdinomamba.evaluation.BinaryAUC` (the metric of the
config) and draws

- a grid, one row per image: the image, its foreground mask, the map of every
  head and the mean map, each map with its Binary-AUC;
- the per-layer curve: Binary-AUC against block index (mean over heads, the
  head-mean map, and the range over heads).

Files are written atomically (temporary file, then rename). matplotlib (Agg) is
imported only when drawing.
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.dataset import pseudo_collate
from mmengine.evaluator import Evaluator
from mmengine.structures import BaseDataElement

from mmdinomamba.utils import dump_atomic
from mmdinomamba.evaluation import BinaryAUC, binary_auc, foreground_mask
from .activation_maps import ActivationMaps, activation_maps, layer_activation_maps
from .adapters import normalise_layers
from .figures import pyplot, save_figure
from .mixing import num_layers

Tensor = torch.Tensor

__all__ = [
    'display_images', 'format_layer_auc', 'label_map', 'layer_auc', 'map_aucs',
    'plot_layer_auc', 'plot_map_grid', 'preprocess_samples', 'write_report'
]


def label_map(sample: BaseDataElement) -> Tensor:
    """The (height, width) label map of a packed sample (mmpretrain or mmseg)."""
    if 'gt_sem_seg' in sample:
        data = sample.gt_sem_seg.data
        return data[0] if data.dim() == 3 else data
    if 'gt_seg_map' in sample:
        return torch.as_tensor(np.asarray(sample.gt_seg_map))
    raise ValueError('the data sample holds no label map (gt_seg_map or gt_sem_seg); '
                     f'its fields: {list(sample.keys())}')


def preprocess_samples(model, dataset, indices: Sequence[int]):
    """Load dataset samples and run the model's data preprocessor on them.

    Args:
        model (ActivationMapModel): the model (its ``data_preprocessor`` is used).
        dataset: an mmengine dataset whose pipeline packs inputs and label maps.
        indices (Sequence[int]): dataset indices.

    Returns:
        tuple: inputs (batch, channels, height, width) normalised, and the list
        of data samples.
    """
    for index in indices:
        if not 0 <= index < len(dataset):
            raise ValueError(f'image index {index} is out of range for a dataset of '
                             f'{len(dataset)} samples')
    data = model.data_preprocessor(pseudo_collate([dataset[i] for i in indices]),
                                   False)
    return data['inputs'], data['data_samples']


def display_images(model, inputs: Tensor) -> np.ndarray:
    """Undo the preprocessor's normalisation: (batch, height, width, 3) in [0, 1]."""
    pre = model.data_preprocessor
    images = inputs.detach().float().cpu()
    if getattr(pre, '_enable_normalize', False):
        images = images * pre.std.cpu() + pre.mean.cpu()
    return (images.clamp(0, 255) / 255).permute(0, 2, 3, 1).numpy()


def _metric(evaluator_cfg: Optional[dict], per_head: bool) -> BinaryAUC:
    """A BinaryAUC with the config's settings (or the defaults)."""
    kwargs = {k: v for k, v in (evaluator_cfg or {}).items()
              if k not in ('type', 'per_head', 'prefix')}
    return BinaryAUC(per_head=per_head, **kwargs)


def layer_auc(model,
              dataset,
              indices: Sequence[int],
              evaluator_cfg: Optional[dict] = None,
              layers: Optional[Sequence[int]] = None,
              batch_size: int = 8) -> List[dict]:
    """Binary-AUC of every layer's maps over dataset samples.

    Args:
        model (ActivationMapModel): its backbone and map options are used, at
            every requested layer.
        dataset: dataset with label maps (e.g. ``ImageNetS``, an mmseg dataset).
        indices (Sequence[int]): dataset indices to score.
        evaluator_cfg (dict, optional): the config's ``test_evaluator`` (a
            BinaryAUC config); None = BinaryAUC's defaults.
        layers (Sequence[int], optional): block indices; None = all.
        batch_size (int): images per forward pass. Defaults to 8.

    Returns:
        list[dict]: per layer ``layer`` (block index, from 0), ``binary_auc``
        (mean over images of the mean over heads), ``mean_map_auc`` (of the
        head-mean map), ``heads`` (per-head AUCs) and ``num_skipped``.
    """
    if not indices:
        raise ValueError('layer_auc needs at least one image')
    evaluators: Dict[int, tuple] = {}
    for start in range(0, len(indices), batch_size):
        inputs, samples = preprocess_samples(model, dataset,
                                             indices[start:start + batch_size])
        maps = layer_activation_maps(model.backbone, inputs, layers, model.method,
                                     model.num_heads, model.feature_source)
        labels = [label_map(s) for s in samples]
        for layer, layer_maps in maps.items():
            pair = evaluators.setdefault(layer, (
                Evaluator(_metric(evaluator_cfg, True)),
                Evaluator(_metric(evaluator_cfg, False))))
            batch = [dict(activation_map=m.cpu(), gt_seg_map=lab)
                     for m, lab in zip(layer_maps.heads, labels)]
            for evaluator in pair:
                evaluator.process(batch)
    rows = []
    for layer, (per_head, head_mean) in sorted(evaluators.items()):
        scores = per_head.evaluate(len(indices))
        num_heads = sum(k.startswith('binary_auc/head_') for k in scores)
        heads = [scores[f'binary_auc/head_{i}'] for i in range(num_heads)] or \
            [scores['binary_auc']]
        rows.append(dict(layer=layer, binary_auc=scores['binary_auc'],
                         mean_map_auc=head_mean.evaluate(len(indices))['binary_auc'],
                         heads=heads, num_skipped=scores['binary_auc/num_skipped']))
    return rows


def map_aucs(maps: ActivationMaps, labels: Sequence[Tensor],
             evaluator_cfg: Optional[dict] = None) -> np.ndarray:
    """Binary-AUC of each map of each image, as BinaryAUC scores it.

    Returns:
        np.ndarray: (batch, heads + 1) float, the heads then the mean map; nan
        where an image has no foreground or no background.
    """
    metric = _metric(evaluator_cfg, True)
    out = []
    for heads, mean, label in zip(maps.heads, maps.mean, labels):
        fg, valid = foreground_mask(label, metric.background_indices,
                                    metric.ignore_index)
        both = torch.cat([heads, mean[None]]).float().cpu()
        both = F.interpolate(both[None], size=tuple(label.shape), mode='bilinear',
                             align_corners=False)[0]
        out.append([binary_auc(m, fg, valid, metric.thresholds) for m in both])
    return np.array(out)


def plot_map_grid(images: np.ndarray, labels: Sequence[Tensor], maps: ActivationMaps,
                  aucs: np.ndarray, path: str, title: str = '',
                  evaluator_cfg: Optional[dict] = None, dpi: int = 100) -> None:
    """One row per image: image, mask, the map of each head, the mean map.

    Each map is min-max normalised for display (as BinaryAUC normalises it) and
    labelled with its AUC. Mask: white foreground, black background, grey ignored.

    Args:
        images (np.ndarray): (batch, height, width, 3) in [0, 1].
        labels (Sequence[Tensor]): (height', width') label maps, any resolution.
        maps (ActivationMaps): heads (batch, heads, height, width) and mean.
        aucs (np.ndarray): (batch, heads + 1), from :func:`map_aucs`.
        path (str): PNG file to write.
        title (str): figure title.
        evaluator_cfg (dict, optional): BinaryAUC settings for the mask.
        dpi (int): resolution of the PNG; a tile is 1.25 inch wide. Defaults to 100.
    """
    plt = pyplot()
    metric = _metric(evaluator_cfg, True)
    batch, num_heads, height, width = maps.heads.shape
    cols = num_heads + 3
    fig, axes = plt.subplots(batch, cols, squeeze=False,
                             figsize=(1.25 * cols, 1.45 * batch + 0.5))
    for row in range(batch):
        fg, valid = foreground_mask(labels[row], metric.background_indices,
                                    metric.ignore_index)
        mask = torch.where(valid, fg.float(), 0.5)[None, None]
        mask = F.interpolate(mask, size=(height, width), mode='nearest')[0, 0]
        tiles = [images[row], mask.numpy()] + \
            [m.float().cpu().numpy() for m in maps.heads[row]] + \
            [maps.mean[row].float().cpu().numpy()]
        names = ['image', 'mask'] + [f'head {g}' for g in range(num_heads)] + ['mean']
        for col, (ax, tile) in enumerate(zip(axes[row], tiles)):
            if col == 0:
                ax.imshow(tile)
            elif col == 1:
                ax.imshow(tile, cmap='gray', vmin=0, vmax=1)
            else:
                ax.imshow(tile, cmap='inferno')  # imshow's own min-max scaling
                auc = aucs[row, col - 2]
                ax.set_xlabel('n/a' if np.isnan(auc) else f'AUC {auc:.2f}',
                              fontsize=7, labelpad=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(names[col], fontsize=8, fontweight='bold'
                             if col == cols - 1 else None)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)


def plot_layer_auc(rows: List[dict], path: str, title: str = '') -> None:
    """Binary-AUC against block index (0-based, as every tool numbers blocks),
    with chance at 0.5.

    Args:
        rows (list[dict]): from :func:`layer_auc`.
        path (str): PNG file to write.
        title (str): figure title.
    """
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    x = [r['layer'] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    low = [min(r['heads']) for r in rows]
    high = [max(r['heads']) for r in rows]
    ax.fill_between(x, low, high, color='tab:blue', alpha=0.15,
                    label='range over heads')
    ax.plot(x, [r['binary_auc'] for r in rows], 'o-', color='tab:blue',
            label='mean over heads')
    ax.plot(x, [r['mean_map_auc'] for r in rows], 's--', color='tab:orange',
            label='head-mean map')
    ax.axhline(0.5, color='gray', linestyle=':', linewidth=1, label='chance')
    ax.set_xlabel('block')
    ax.set_ylabel('Binary-AUC')
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='lower right')
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)



def format_layer_auc(rows: List[dict]) -> str:
    """The per-layer table of :func:`layer_auc` rows (blocks 0-based, as every
    tool numbers them)."""
    lines = ['block  binary_auc  mean_map_auc  skipped']
    lines += [f"{row['layer']:5d}  {row['binary_auc']:10.4f}  "
              f"{row['mean_map_auc']:12.4f}  {row['num_skipped']:7d}" for row in rows]
    return '\n'.join(lines)


def write_report(model, dataset, out_dir: str, grid_images: Sequence[int],
                 curve_images: int, layers: Optional[Sequence[int]] = None,
                 batch_size: int = 8, evaluator_cfg: Optional[dict] = None,
                 dpi: int = 100, weights: str = 'random init',
                 meta: Optional[dict] = None):
    """The grid, the per-layer curve and its JSON for an ``ActivationMapModel``.

    Writes ``activation_maps.png`` (the maps of ``grid_images`` at the model's
    layer), ``layer_auc.png`` and ``layer_auc.json`` (Binary-AUC of every layer
    over the first ``curve_images`` images) to ``out_dir``.

    Args:
        model (ActivationMapModel): on its device, in eval mode.
        dataset: dataset with label maps.
        out_dir (str): output folder.
        grid_images (Sequence[int]): dataset indices of the grid rows.
        curve_images (int): images of the curve (the first ones of the dataset).
        layers (Sequence[int], optional): blocks of the curve; None = all.
        batch_size (int): images per forward pass. Defaults to 8.
        evaluator_cfg (dict, optional): the config's ``test_evaluator``.
        dpi (int): resolution of the grid. Defaults to 100.
        weights (str): what the weights are, for the titles.
        meta (dict, optional): extra entries of the JSON (config, checkpoint).

    Returns:
        tuple: paths ``grid``, ``curve``, ``json``, and the :func:`layer_auc` rows.
    """
    name = type(model.backbone).__name__
    inputs, samples = preprocess_samples(model, dataset, grid_images)
    maps = activation_maps(model.backbone, inputs, model.layer, model.method,
                           model.num_heads, model.feature_source)
    labels = [label_map(s) for s in samples]
    aucs = map_aucs(maps, labels, evaluator_cfg)
    depth = num_layers(model.backbone)
    block = normalise_layers([model.layer], depth)[0] + 1
    paths = dict(grid=osp.join(out_dir, 'activation_maps.png'),
                 curve=osp.join(out_dir, 'layer_auc.png'),
                 json=osp.join(out_dir, 'layer_auc.json'))
    plot_map_grid(display_images(model, inputs), labels, maps, aucs, paths['grid'],
                  f'{name} ({weights}), block {block} of {depth}, {model.method} '
                  'maps', evaluator_cfg, dpi=dpi)
    indices = list(range(min(curve_images, len(dataset))))
    rows = layer_auc(model, dataset, indices, evaluator_cfg, layers, batch_size)
    plot_layer_auc(rows, paths['curve'], f'{name} ({weights}), {len(indices)} '
                   f'images, {model.method} maps')
    dump_atomic(dict(**(meta or {}), method=model.method, num_images=len(indices),
                     layers=rows, grid=dict(images=list(grid_images),
                                            layer=model.layer, aucs=aucs.tolist())),
                paths['json'])
    return paths, rows
