"""Mixing-matrix rank analysis of a backbone: the measures (tables and plots are
:mod:`.rank_report`; models come from :func:`.loading.load_backbone`, images from
:mod:`.images`).

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
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from .adapters import as_backbone
from .mixing import (MixerInfo, capture_mixer_inputs, mixer_info, mixing_matrices,
                     normalise_layers, ssd_decay_masks)
from .rank import (block_rank_summary, block_ranks, chunk_sizes, default_rtol,
                   numerical_rank, rank_measures)

Tensor = torch.Tensor

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
