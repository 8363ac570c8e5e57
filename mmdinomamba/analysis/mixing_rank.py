"""Mixing-matrix rank analysis of a backbone: model, images, measures, table, plots.

For each image and each requested layer, the token mixer's input is captured
(:func:`~mmdinomamba.analysis.mixing.capture_mixer_inputs`), its matrices M are
materialised in float64 (:func:`~mmdinomamba.analysis.mixing.mixing_matrices`)
and measured (:func:`~mmdinomamba.analysis.rank.rank_measures`). Results are
kept per head and summarised per (layer, matrix) next to the bounds
(``global_bound`` for the whole matrix, ``offdiag_bound_paper`` and
``offdiag_bound_algebra`` for a block off the diagonal; L = seqlen, c = chunk):

=======  ===========  ===========================  ==========================
kind     whole M      off-diagonal block, paper    off-diagonal block, algebra
=======  ===========  ===========================  ==========================
softmax  L            c                            c
linear   D_QK         D_QK                         min(D_QK, c)
ssd      L            rank(L_M) * N                min(N, c)
=======  ===========  ===========================  ==========================

``rank(L_M)`` is measured: the numerical rank of the whole learnable mask
``L_M`` of the head (largest over heads and images; for 'combined', over both
directions). The mask is triangular with ones on its diagonal, so this is
seqlen and the paper's bound exceeds the block size. The algebra bound uses
that Mamba-2's decay is one scalar per head and token: on a block strictly off
the diagonal ``L_M`` is ``exp(cs_i) exp(-cs_j)``, rank 1 (reported as
``mask_offdiag_rank_max``), so the block of ``M = L_M o (C B^T)`` has rank <= N
(the matrix is N-semiseparable). The bidirectional 'combined' matrix takes its
blocks below the diagonal from the forward matrix and those above from the
backward one, so the same bound holds.
"""
import copy
import csv
import io
import json
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log

from mmdinomamba.engine.checkpoint import write_atomic

from .figures import pyplot, save_figure
from .adapters import as_backbone
from .mixing import (MixerInfo, capture_mixer_inputs, mixer_info, mixing_matrices,
                     normalise_layers, ssd_decay_masks)
from .rank import (block_rank_summary, block_ranks, chunk_sizes, default_rtol,
                   numerical_rank, rank_measures)

Tensor = torch.Tensor

# mmpretrain's ImageNet data preprocessor (RGB, 0-255 scale)
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')

# summary columns, in table order
SUMMARY_COLUMNS = (
    'layer', 'key', 'kind', 'nheads', 'seqlen', 'chunk', 'd_qk', 'rank_mean',
    'rank_min', 'rank_max', 'effective_rank_mean', 'diag_rank_min',
    'diag_rank_deficit_max', 'offdiag_rank_max', 'offdiag_rank_mean',
    'offdiag_bound_algebra', 'offdiag_bound_paper', 'global_bound', 'mask_rank_max',
    'mask_offdiag_rank_max', 'within_bounds')
RECORD_COLUMNS = (
    'image', 'layer', 'key', 'kind', 'head', 'seqlen', 'rank', 'effective_rank',
    'tolerance', 'diag_rank_min', 'diag_rank_max', 'diag_rank_deficit_max',
    'offdiag_rank_max', 'offdiag_rank_mean', 'lower_offdiag_rank_max',
    'upper_offdiag_rank_max', 'mask_rank', 'mask_offdiag_rank_max')


# --------------------------------------------------------------------------- #
# Model
# --------------------------------------------------------------------------- #
def backbone_config(config: Union[str, Config]) -> dict:
    """The backbone part of a config: ``model.backbone``, or ``model`` itself.

    Args:
        config (str | Config): a config file or a loaded config.

    Returns:
        dict: the backbone config (with ``type``).
    """
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    model = cfg.get('model')
    if not isinstance(model, dict):
        raise ValueError(f'{getattr(cfg, "filename", config)}: the config has no '
                         '`model` dict')
    backbone = model.get('backbone', model)
    if not isinstance(backbone, dict) or 'type' not in backbone:
        raise ValueError('the config\'s `model` (or `model.backbone`) must be a dict '
                         f'with a `type`, got {backbone!r}')
    return backbone.to_dict() if isinstance(backbone, ConfigDict) else dict(backbone)


def build_backbone(cfg: dict) -> nn.Module:
    """Build a backbone from its config through mmpretrain's registry.

    Without mmpretrain installed, our own backbones (``DinoVim``, ``LinearViT``)
    are built directly.
    """
    cfg = copy.deepcopy(cfg)
    try:
        from mmpretrain.registry import MODELS
    except ImportError:
        MODELS = None
    if MODELS is not None:
        import mmdinomamba  # noqa: F401  registers our classes into mmpretrain
        return MODELS.build(cfg)
    from mmdinomamba.models import backbones
    name = cfg.pop('type').split('.')[-1]
    own = {'DinoVim': backbones.DinoVim, 'LinearViT': backbones.LinearViT}
    if name not in own:
        raise ValueError(f'backbone type {name!r} needs mmpretrain (not installed); '
                         f'without it only {sorted(own)} can be built')
    return own[name](**cfg)


def initialise_weights(backbone: nn.Module) -> None:
    """``backbone.init_weights()`` without mmengine's per-parameter INFO dump."""
    import logging

    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        backbone.init_weights()
    finally:
        logger.setLevel(level)


def _best_prefix(keys: Sequence[str], model_keys: set) -> Optional[str]:
    """The key prefix (cut at a '.') under which most model keys appear."""
    counts: Dict[str, int] = {}
    for key in keys:
        cuts = [0] + [i + 1 for i, ch in enumerate(key) if ch == '.']
        for cut in cuts:
            if key[cut:] in model_keys:
                counts[key[:cut]] = counts.get(key[:cut], 0) + 1
    return max(counts, key=lambda p: (counts[p], -len(p))) if counts else None


def load_backbone_checkpoint(backbone: nn.Module, path: str,
                             prefix: Optional[str] = None) -> str:
    """Load backbone weights from a checkpoint file.

    The state dict is ``ckpt['state_dict']`` (mmengine), ``ckpt['teacher']``
    (official DINO checkpoints), ``ckpt['model']`` or the checkpoint itself.
    Keys are taken under ``prefix`` (e.g. ``'backbone.'``); with None, the
    prefix under which most of the backbone's keys are found. Every backbone
    parameter must be present: missing keys raise.

    Args:
        backbone (nn.Module): the model to fill.
        path (str): checkpoint file.
        prefix (str, optional): key prefix; None to detect it.

    Returns:
        str: the prefix used.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint {path!r} does not exist')
    from mmengine.runner import CheckpointLoader

    from mmdinomamba.engine.checkpoint import allow_mmengine_checkpoint_types
    allow_mmengine_checkpoint_types()
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    state = ckpt
    for name in ('state_dict', 'teacher', 'model'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(name), dict):
            state = ckpt[name]
            break
    if not isinstance(state, dict):
        raise ValueError(f'{path}: no state dict found in the checkpoint')
    model_keys = set(backbone.state_dict())
    if prefix is None:
        prefix = _best_prefix(list(state), model_keys)
        if prefix is None:
            raise ValueError(f'{path}: none of its keys (e.g. {list(state)[:3]}) '
                             'matches the backbone; check the config or pass a prefix')
    picked = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    result = backbone.load_state_dict(picked, strict=False)
    if result.missing_keys:
        raise ValueError(f'{path}: {len(result.missing_keys)} backbone keys missing '
                         f'under prefix {prefix!r}, e.g. {result.missing_keys[:5]}')
    if result.unexpected_keys:
        print_log(f'{path}: ignored {len(result.unexpected_keys)} keys under '
                  f'{prefix!r}, e.g. {result.unexpected_keys[:5]}', logger='current')
    print_log(f'loaded {len(picked)} backbone tensors from {path} (prefix '
              f'{prefix!r})', logger='current')
    return prefix


# --------------------------------------------------------------------------- #
# Images
# --------------------------------------------------------------------------- #
def preprocess(image: np.ndarray, size: int) -> Tensor:
    """uint8 RGB (height, width, 3) -> normalised (3, size, size).

    The shorter side is resized to ``size`` (bicubic), then centre-cropped.
    """
    from PIL import Image
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f'expected a uint8 RGB image (height, width, 3), got '
                         f'{image.dtype} {image.shape}')
    h, w = image.shape[:2]
    scale = size / min(h, w)
    new = (max(size, round(w * scale)), max(size, round(h * scale)))
    pil = Image.fromarray(image)
    if new != (w, h):
        pil = pil.resize(new, Image.BICUBIC)
    left, top = (new[0] - size) // 2, (new[1] - size) // 2
    array = np.asarray(pil.crop((left, top, left + size, top + size)), np.float32)
    array = (array - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD,
                                                                      np.float32)
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def toy_images(num: int, size: int, seed: int = 0, num_classes: int = 4) -> Tensor:
    """``num`` images of the toy generator (:mod:`mmdinomamba.datasets.toy`).

    Image ``i`` has class ``i % num_classes`` and is drawn from
    ``numpy.random.default_rng([seed, i])``.

    Returns:
        Tensor: (num, 3, size, size), normalised.
    """
    from mmdinomamba.datasets import render_toy_sample
    if num < 1:
        raise ValueError(f'num must be >= 1, got {num}')
    images = [render_toy_sample(np.random.default_rng([seed, i]), i % num_classes,
                                num_classes, size)[0] for i in range(num)]
    return torch.stack([preprocess(image, size) for image in images])


def folder_images(folder: str, num: int, size: int) -> Tensor:
    """The first ``num`` images (sorted paths, searched recursively) of a folder.

    Returns:
        Tensor: (num_found, 3, size, size), normalised; num_found <= num.
    """
    from PIL import Image
    if not osp.isdir(folder):
        raise FileNotFoundError(f'image folder {folder!r} does not exist')
    paths = sorted(
        osp.join(root, name) for root, _, names in os.walk(folder) for name in names
        if name.lower().endswith(IMAGE_EXTENSIONS))
    if not paths:
        raise ValueError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) under {folder!r}')
    images = []
    for path in paths[:num]:
        with Image.open(path) as image:
            images.append(preprocess(np.asarray(image.convert('RGB')), size))
    return torch.stack(images)


# --------------------------------------------------------------------------- #
# Analysis
# --------------------------------------------------------------------------- #
@dataclass
class RankReport:
    """What :func:`analyse_backbone` measured.

    Attributes:
        meta (dict): settings (chunk, tolerance rule, dtype, layers, ...).
        records (list[dict]): one per (image, layer, key, head), columns
            :data:`RECORD_COLUMNS`.
        summary (list[dict]): one per (layer, key), columns :data:`SUMMARY_COLUMNS`.
        spectra (dict): ``'<layer>/<key>'`` -> mean over images and heads of the
            singular values divided by the largest (descending).
    """
    meta: dict
    records: List[dict] = field(default_factory=list)
    summary: List[dict] = field(default_factory=list)
    spectra: Dict[str, List[float]] = field(default_factory=dict)


def offdiag_bounds(info: MixerInfo, chunk: int, seqlen: int,
                   mask_rank: Optional[int] = None) -> dict:
    """The bounds of the table in the module docstring.

    Args:
        info (MixerInfo): the mixer.
        chunk (int): block size c.
        seqlen (int): tokens.
        mask_rank (int, optional): rank(L_M) (ssd only).

    Returns:
        dict: ``global_bound``, ``offdiag_bound_paper``, ``offdiag_bound_algebra``.
    """
    c = min(chunk, seqlen)
    if info.kind == 'softmax':
        return dict(global_bound=seqlen, offdiag_bound_paper=c, offdiag_bound_algebra=c)
    if info.kind == 'linear':
        return dict(global_bound=min(info.d_qk, seqlen), offdiag_bound_paper=info.d_qk,
                    offdiag_bound_algebra=min(info.d_qk, c))
    if mask_rank is None:
        raise ValueError('the ssd bounds need mask_rank = rank(L_M)')
    return dict(global_bound=seqlen, offdiag_bound_paper=mask_rank * info.d_qk,
                offdiag_bound_algebra=min(info.d_qk, c))


def _mask_ranks(masks: Dict[str, Tensor], chunk: int, rtol, atol) -> Dict[str, tuple]:
    """key -> (rank of L_M, max rank of its off-diagonal blocks), each
    (batch, nheads)."""
    out = {}
    for key, L in masks.items():
        summary = block_rank_summary(block_ranks(L, chunk, rtol, atol),
                                     chunk_sizes(L.shape[-1], chunk))
        out[key] = (numerical_rank(L, rtol, atol), summary['offdiag_max'])
    if {'forward', 'backward'} <= set(out):
        out['combined'] = tuple(torch.maximum(a, b) for a, b in
                                zip(out['forward'], out['backward']))
    return out


# record column -> key of rank_measures (and of the mask measures)
_RECORD_FIELDS = dict(
    rank='rank', effective_rank='effective_rank', tolerance='tolerance',
    diag_rank_min='diag_min', diag_rank_max='diag_max',
    diag_rank_deficit_max='diag_deficit_max', offdiag_rank_max='offdiag_max',
    offdiag_rank_mean='offdiag_mean', lower_offdiag_rank_max='lower_offdiag_max',
    upper_offdiag_rank_max='upper_offdiag_max', mask_rank='mask_rank',
    mask_offdiag_rank_max='mask_offdiag_max')


@torch.no_grad()
def analyse_backbone(backbone: nn.Module, images: Tensor,
                     layers: Optional[Sequence[int]] = None, chunk: int = 64,
                     rtol: Optional[float] = None, atol: float = 0.0,
                     dtype: torch.dtype = torch.float64,
                     device: Union[str, torch.device] = 'cpu',
                     progress: bool = True) -> RankReport:
    """Measure the mixing matrices of ``layers`` on ``images``.

    Args:
        backbone (nn.Module): DinoVim, LinearViT or mmpretrain VisionTransformer.
        images (Tensor): (num_images, 3, height, width), normalised.
        layers (Sequence[int], optional): block indices; None for all.
        chunk (int): block size c. Defaults to 64.
        rtol (float, optional): relative rank tolerance; None for
            ``max(m, n) * eps(dtype)``.
        atol (float): absolute rank tolerance. Defaults to 0.
        dtype (torch.dtype): dtype M is materialised in. Defaults to float64.
        device (str | torch.device): where to compute. Defaults to 'cpu'.
        progress (bool): show a progress bar. Defaults to True.

    Returns:
        RankReport: per-head records, per-(layer, key) summary and spectra.
        The backbone is moved to ``device`` and left in eval mode.
    """
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f'images must have shape (num, 3, height, width), got '
                         f'{tuple(images.shape)}')
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f'chunk must be a positive int, got {chunk!r}')
    api = as_backbone(backbone)
    indices = normalise_layers(range(api.num_layers) if layers is None else layers,
                               api.num_layers)
    backbone.to(device)
    backbone.eval()  # not chained: some backbones' train() returns None
    # float64 copies of the mixers, made once
    mixers = {i: copy.deepcopy(api.token_mixer(i)).to(dtype) for i in indices}
    infos = {i: mixer_info(m) for i, m in mixers.items()}
    records: List[dict] = []
    spectra_sum: Dict[tuple, Tensor] = {}
    bar = None
    if progress:
        from mmengine.utils import ProgressBar
        bar = ProgressBar(len(images) * len(indices))
    for image_index, image in enumerate(images):
        inputs = capture_mixer_inputs(backbone, image[None].to(device), indices)
        for layer in indices:
            info, mixer, u = infos[layer], mixers[layer], inputs[layer]
            mats = mixing_matrices(mixer, u, dtype)
            masks = (_mask_ranks(ssd_decay_masks(mixer, u, dtype), chunk, rtol, atol)
                     if info.kind == 'ssd' else {})
            for key in info.keys:
                m = {k: v.cpu() for k, v in
                     rank_measures(mats[key], chunk, rtol, atol).items()}
                S = m['singular_values'][0]  # (nheads, seqlen)
                normed = S / S[:, :1].clamp(min=torch.finfo(S.dtype).tiny)
                spectra_sum[(layer, key)] = spectra_sum.get((layer, key), 0) + \
                    normed.sum(0)
                if key in masks:
                    m['mask_rank'], m['mask_offdiag_max'] = (
                        t.cpu() for t in masks[key])
                for head in range(info.nheads):
                    row = dict(image=image_index, layer=layer, key=key,
                               kind=info.kind, head=head, seqlen=S.shape[-1])
                    row.update({column: m[name][0, head].item()
                                for column, name in _RECORD_FIELDS.items()
                                if name in m})
                    records.append(row)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.file.write('\n')
    spectra = {f'{layer}/{key}': (total / (len(images) * infos[layer].nheads)).tolist()
               for (layer, key), total in spectra_sum.items()}
    summary = [_summarise(records, layer, key, infos[layer], chunk)
               for layer in indices for key in infos[layer].keys]
    seqlens = sorted({r['seqlen'] for r in records})
    meta = dict(
        chunk=chunk, layers=indices, num_images=len(images),
        image_size=list(images.shape[-2:]), seqlen=seqlens[0] if len(seqlens) == 1
        else seqlens, dtype=str(dtype).replace('torch.', ''), device=str(device),
        rtol=rtol, atol=atol,
        tolerance_rule='tol = max(atol, rtol * sigma_max); rtol defaults to '
        'max(rows, cols) * eps(dtype) when atol == 0 (LAPACK/NumPy/torch), else 0; '
        'every block gets its own tolerance',
        default_rtol_whole_matrix=default_rtol(seqlens[0], seqlens[0], dtype),
        kinds=sorted({info.kind for info in infos.values()}))
    return RankReport(meta=meta, records=records, summary=summary, spectra=spectra)


def _summarise(records: List[dict], layer: int, key: str, info: MixerInfo,
               chunk: int) -> dict:
    rows = [r for r in records if r['layer'] == layer and r['key'] == key]
    seqlen = max(r['seqlen'] for r in rows)
    mask_rank = max(r['mask_rank'] for r in rows) if info.kind == 'ssd' else None
    bounds = offdiag_bounds(info, chunk, seqlen, mask_rank)
    ranks = [r['rank'] for r in rows]
    out = dict(
        layer=layer, key=key, kind=info.kind, nheads=info.nheads, seqlen=seqlen,
        chunk=chunk, d_qk=info.d_qk, rank_mean=float(np.mean(ranks)),
        rank_min=min(ranks), rank_max=max(ranks),
        effective_rank_mean=float(np.mean([r['effective_rank'] for r in rows])),
        diag_rank_min=min(r['diag_rank_min'] for r in rows),
        diag_rank_deficit_max=max(r['diag_rank_deficit_max'] for r in rows),
        offdiag_rank_max=max(r['offdiag_rank_max'] for r in rows),
        offdiag_rank_mean=float(np.mean([r['offdiag_rank_mean'] for r in rows])),
        **bounds,
        mask_rank_max=mask_rank,
        mask_offdiag_rank_max=(max(r['mask_offdiag_rank_max'] for r in rows)
                               if info.kind == 'ssd' else None))
    out['within_bounds'] = bool(
        out['offdiag_rank_max'] <= bounds['offdiag_bound_algebra']
        and out['rank_max'] <= bounds['global_bound'])
    return out


# --------------------------------------------------------------------------- #
# Output
# --------------------------------------------------------------------------- #
def format_table(summary: List[dict]) -> str:
    """A Markdown table of the summary (one row per layer and matrix)."""
    head = ('| layer | matrix | heads | L | rank mean [min, max] | eff. rank | '
            'diag deficit | off-diag max (mean) | bound: algebra | bound: paper |')
    lines = [head, '|' + '---|' * (head.count('|') - 1)]
    for s in summary:
        name = s['key'] if s['key'] != 'attention' else s['kind']
        paper = s['offdiag_bound_paper']
        if s['kind'] == 'ssd':
            paper = f'{paper} = {s["mask_rank_max"]} x {s["d_qk"]}'
        lines.append(
            f"| {s['layer']} | {name} | {s['nheads']} | {s['seqlen']} | "
            f"{s['rank_mean']:.1f} [{s['rank_min']}, {s['rank_max']}] | "
            f"{s['effective_rank_mean']:.1f} | {s['diag_rank_deficit_max']} | "
            f"{s['offdiag_rank_max']} ({s['offdiag_rank_mean']:.1f}) | "
            f"{s['offdiag_bound_algebra']} | {paper} |")
    return '\n'.join(lines)


def _write_text(path: str, text: str) -> None:
    def write(tmp):
        with open(tmp, 'w', newline='') as f:
            f.write(text)
    write_atomic(path, write)


def _csv_text(rows: List[dict], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction='ignore',
                            lineterminator='\n')
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ('' if row.get(k) is None else row.get(k))
                         for k in columns})
    return buffer.getvalue()


def _layer_colours(n: int):
    import matplotlib
    cmap = matplotlib.colormaps['viridis']
    return [cmap(i / max(n - 1, 1)) for i in range(n)]


def _matrix_name(summary: dict) -> str:
    return summary['kind'] if summary['key'] == 'attention' else \
        f"{summary['kind']} {summary['key']}"


def plot_spectra(report: RankReport, path: str, title: str = '') -> None:
    """Normalised singular-value spectra, one panel per matrix, one curve per layer.

    Each curve is ``sigma_k / sigma_1`` averaged over heads and images; the
    dotted line is the default relative rank tolerance of the whole matrix
    (or ``rtol`` when given), the dashed line a rank bound below seqlen.
    """
    plt = pyplot()
    keys = list(dict.fromkeys(s['key'] for s in report.summary))
    layers = report.meta['layers']
    fig, axes = plt.subplots(1, len(keys), figsize=(max(4.4 * len(keys), 6.0), 4.0),
                             squeeze=False)
    colours = _layer_colours(len(layers))
    rtol = report.meta['rtol']
    floor = report.meta['default_rtol_whole_matrix'] if rtol is None else rtol
    for ax, key in zip(axes[0], keys):
        lowest = 1.0
        for colour, layer in zip(colours, layers):
            values = np.clip(np.asarray(report.spectra[f'{layer}/{key}']), 1e-18, None)
            lowest = min(lowest, float(values.min()))
            ax.semilogy(np.arange(1, len(values) + 1), values, color=colour, lw=1.2,
                        label=f'layer {layer}')
        summary = next(s for s in report.summary if s['key'] == key)
        if summary['global_bound'] < summary['seqlen']:
            ax.axvline(summary['global_bound'], color='k', ls='--', lw=0.8,
                       label=f"bound D_QK = {summary['global_bound']}")
        if floor:
            ax.axhline(floor, color='grey', ls=':', lw=1, label='rank tolerance')
            lowest = min(lowest, floor)
        ax.set_ylim(max(lowest / 10, 1e-18), 2)
        ax.set_title(_matrix_name(summary))
        ax.set_xlabel('index k')
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('sigma_k / sigma_1, mean over heads and images')
    axes[0][-1].legend(fontsize=7, loc='lower left')
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_rank_vs_layer(report: RankReport, path: str, title: str = '') -> None:
    """Whole-matrix rank and off-diagonal block rank against layer, with bounds."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator
    keys = list(dict.fromkeys(s['key'] for s in report.summary))
    fig, (ax_g, ax_o) = plt.subplots(1, 2, figsize=(10.5, 4))
    seqlen = report.summary[0]['seqlen']
    top_o, notes = 1, []
    for colour, key in zip(('C0', 'C1', 'C2', 'C3'), keys):
        rows = [s for s in report.summary if s['key'] == key]
        x = [s['layer'] for s in rows]
        name = _matrix_name(rows[0])
        ax_g.plot(x, [s['rank_mean'] for s in rows], 'o-', color=colour,
                  label=f'{name}: rank')
        ax_g.plot(x, [s['effective_rank_mean'] for s in rows], 's--', color=colour,
                  mfc='none', label=f'{name}: effective rank')
        ax_o.plot(x, [s['offdiag_rank_max'] for s in rows], 'o-', color=colour,
                  label=f'{name}: max')
        ax_o.plot(x, [s['offdiag_rank_mean'] for s in rows], 's--', color=colour,
                  mfc='none', label=f'{name}: mean')
        algebra = rows[0]['offdiag_bound_algebra']
        ax_o.axhline(algebra, color=colour, ls=':', lw=1.2,
                     label=f'{name}: bound {algebra}')
        paper = max(s['offdiag_bound_paper'] for s in rows)
        if paper != algebra:
            notes.append((rows[0]['kind'], paper))
        top_o = max(top_o, algebra, max(s['offdiag_rank_max'] for s in rows))
    ax_g.axhline(seqlen, color='k', ls=':', lw=1, label=f'L = {seqlen}')
    ax_g.set_ylim(0, seqlen * 1.08)
    ax_o.set_ylim(0, top_o * 1.25)
    ax_g.set_title('whole matrix (mean over heads, images)', fontsize=10)
    ax_o.set_title(f"off-diagonal blocks, c = {report.meta['chunk']} "
                   '(over heads, images)', fontsize=10)
    for ax in (ax_g, ax_o):
        ax.set_xlabel('layer')
        ax.set_ylabel('rank')
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc='lower left', ncol=2)
    if notes:
        text = '\n'.join(f"{kind}: paper's bound {paper}"
                         for kind, paper in dict.fromkeys(notes))
        ax_o.text(0.98, 0.97, text, transform=ax_o.transAxes, fontsize=7, ha='right',
                  va='top')
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def write_report(report: RankReport, out_dir: str, title: str = '') -> Dict[str, str]:
    """Write the JSON, the two CSV tables, the Markdown table and both plots.

    Every file is written to a temporary name and renamed into place.

    Returns:
        dict: name -> path (``json``, ``summary_csv``, ``heads_csv``, ``table``,
        ``spectra_png``, ``rank_png``).
    """
    paths = dict(json=osp.join(out_dir, 'mixer_rank.json'),
                 summary_csv=osp.join(out_dir, 'mixer_rank.csv'),
                 heads_csv=osp.join(out_dir, 'mixer_rank_heads.csv'),
                 table=osp.join(out_dir, 'mixer_rank.md'),
                 spectra_png=osp.join(out_dir, 'spectra.png'),
                 rank_png=osp.join(out_dir, 'rank_vs_layer.png'))
    _write_text(paths['json'], json.dumps(
        dict(meta=report.meta, summary=report.summary, records=report.records,
             spectra=report.spectra), indent=1))
    _write_text(paths['summary_csv'], _csv_text(report.summary, SUMMARY_COLUMNS))
    _write_text(paths['heads_csv'], _csv_text(report.records, RECORD_COLUMNS))
    _write_text(paths['table'], format_table(report.summary) + '\n')
    plot_spectra(report, paths['spectra_png'], title)
    plot_rank_vs_layer(report, paths['rank_png'], title)
    return paths
