"""Mixing-matrix rank analysis of a backbone: the measures (tables and plots are
:mod:`.rank_report`; models come from :func:`.loading.load_backbone`, images from
:mod:`.images`).

For each image and each requested layer, the token mixer's input is captured
(:func:`~mmdinomamba.analysis.mixing.capture_mixer_calls`), its matrices M are
materialised in float64 (:func:`~mmdinomamba.analysis.mixing.mixing_matrices`)
and measured (:func:`~mmdinomamba.analysis.rank.rank_measures`). Results are
kept per head and summarised per (layer, matrix) next to the bounds
(``global_bound`` for the whole matrix, ``offdiag_bound_paper`` and
``offdiag_bound_algebra`` for a block off the diagonal; L = seqlen, c = chunk):

=============  ===========  ===========================  ==========================
kind (key)     whole M      off-diagonal block, paper    off-diagonal block, algebra
=============  ===========  ===========================  ==========================
softmax        L            c                            c
linear         D_QK         D_QK                         min(D_QK, c)
ssd            L            rank(L_M) * N                min(N, c)
mlla attention D_QK         D_QK                         min(D_QK, c)
mlla whole     L (generic)  d + min(c, r)                near: min(c, d + min(c, r));
                                                         far: min(d, c)
=============  ===========  ===========================  ==========================

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

MLLA (kind 'mlla', :class:`~mmdinomamba.models.mixers.LinearAttentionMixer`):
the attention part ``A_h`` ('attention', per head) is linear attention, rank <=
d = D_QK (RoPE rotates its two factors token by token, the normaliser scales its
rows); with a forget gate it is causal and d-semiseparable (whole rank L). The
whole matrix ('whole', per channel) adds the LePE stencil ``P_c``, a banded 2-D
convolution operator that is generically invertible, so it is generically full
rank. ``P_c`` reaches ``r = (k // 2) * (W + 1)`` raster positions from the
diagonal (k = 3, W = the grid width): an off-diagonal block within ``r``
positions of the diagonal (*near*) has rank <= d + min(c, r), every farther
block (*far*) rank <= d. Both are measured separately
(``near_offdiag_rank_max``, ``far_offdiag_rank_max``, with
``near_offdiag_bound``, ``far_offdiag_bound``); for the other kinds they are
empty. ``nheads`` of a 'whole' row counts channels.

Backbones whose blocks work on different grids (a hierarchical backbone's
stages) are measured block by block on their own grids: ``seqlen`` differs per
layer.
"""
import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from .adapters import as_backbone
from .mixing import (MixerInfo, capture_mixer_calls, mixer_info, mixing_matrices,
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
    'mask_offdiag_rank_max', 'grid_width', 'near_offdiag_rank_max',
    'near_offdiag_bound', 'far_offdiag_rank_max', 'far_offdiag_bound',
    'within_bounds')
RECORD_COLUMNS = (
    'image', 'layer', 'key', 'kind', 'head', 'seqlen', 'rank', 'effective_rank',
    'tolerance', 'diag_rank_min', 'diag_rank_max', 'diag_rank_deficit_max',
    'offdiag_rank_max', 'offdiag_rank_mean', 'lower_offdiag_rank_max',
    'upper_offdiag_rank_max', 'mask_rank', 'mask_offdiag_rank_max',
    'near_offdiag_rank_max', 'far_offdiag_rank_max')


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


def stencil_reach(info: MixerInfo, width: Optional[int]) -> int:
    """Raster positions the per-channel stencil of an 'mlla' 'whole' matrix
    reaches from the diagonal on a ``width``-wide grid (0 without a stencil)."""
    if not info.local_kernel:
        return 0
    if width is None:
        raise ValueError('the bounds of a local stencil need the grid width')
    return (info.local_kernel // 2) * (width + 1)


def offdiag_bounds(info: MixerInfo, chunk: int, seqlen: int,
                   mask_rank: Optional[int] = None, key: str = 'attention',
                   width: Optional[int] = None) -> dict:
    """The bounds of the table in the module docstring.

    Args:
        info (MixerInfo): the mixer.
        chunk (int): block size c.
        seqlen (int): tokens.
        mask_rank (int, optional): rank(L_M) (ssd only).
        key (str): the matrix ('attention', 'whole', ...). Defaults to 'attention'.
        width (int, optional): grid width W (mlla 'whole' with a stencil).

    Returns:
        dict: ``global_bound``, ``offdiag_bound_paper``, ``offdiag_bound_algebra``,
        ``near_offdiag_bound`` and ``far_offdiag_bound`` (mlla only, else None).
    """
    c = min(chunk, seqlen)
    near = far = None
    if info.kind == 'softmax':
        out = dict(global_bound=seqlen, offdiag_bound_paper=c, offdiag_bound_algebra=c)
    elif info.kind == 'linear':
        out = dict(global_bound=min(info.d_qk, seqlen), offdiag_bound_paper=info.d_qk,
                   offdiag_bound_algebra=min(info.d_qk, c))
    elif info.kind == 'mlla':
        d = info.d_qk
        if key == 'whole':
            near = min(c, d + min(c, stencil_reach(info, width)))
            far = min(d, c)
            out = dict(global_bound=seqlen, offdiag_bound_paper=near,
                       offdiag_bound_algebra=near)
        else:
            near = far = min(d, c)
            out = dict(global_bound=seqlen if info.causal else min(d, seqlen),
                       offdiag_bound_paper=d, offdiag_bound_algebra=near)
    else:
        if mask_rank is None:
            raise ValueError('the ssd bounds need mask_rank = rank(L_M)')
        out = dict(global_bound=seqlen, offdiag_bound_paper=mask_rank * info.d_qk,
                   offdiag_bound_algebra=min(info.d_qk, c))
    return dict(out, near_offdiag_bound=near, far_offdiag_bound=far)


def near_far_ranks(blocks: Tensor, chunk: int, reach: int) -> tuple:
    """Largest rank of the off-diagonal blocks within ``reach`` raster positions of
    the diagonal (near) and of the others (far).

    Block (I, J), I != J, of chunk size c is near when its closest pair of
    tokens, ``(|I - J| - 1) c + 1`` positions apart, is within ``reach``.

    Args:
        blocks (Tensor): (..., nchunks, nchunks) block ranks.
        chunk (int): c.
        reach (int): raster positions.

    Returns:
        tuple: (near max, far max), each (...,) int64, or None where there is
        no such block.
    """
    n = blocks.shape[-1]
    idx = torch.arange(n, device=blocks.device)
    gap = (idx[:, None] - idx[None, :]).abs()
    off = gap > 0
    near = off & ((gap - 1) * chunk + 1 <= reach)
    far = off & ~near
    return tuple(blocks[..., mask].max(-1).values if mask.any() else None
                 for mask in (near, far))


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
    mask_offdiag_rank_max='mask_offdiag_max', near_offdiag_rank_max='near_offdiag_max',
    far_offdiag_rank_max='far_offdiag_max')


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
    counts: Dict[tuple, int] = {}
    widths: Dict[int, int] = {}
    bar = None
    if progress:
        from mmengine.utils import ProgressBar
        bar = ProgressBar(len(images) * len(indices))
    for image_index, image in enumerate(images):
        calls = capture_mixer_calls(backbone, image[None].to(device), indices)
        for layer in indices:
            info, mixer, (u, hw) = infos[layer], mixers[layer], calls[layer]
            widths[layer] = hw[1]
            mats = mixing_matrices(mixer, u, dtype, hw)
            masks = (_mask_ranks(ssd_decay_masks(mixer, u, dtype), chunk, rtol, atol)
                     if info.kind == 'ssd' else {})
            for key in info.keys:
                m = {k: v.cpu() for k, v in
                     rank_measures(mats[key], chunk, rtol, atol).items()}
                S = m['singular_values'][0]  # (nheads or channels, seqlen)
                normed = S / S[:, :1].clamp(min=torch.finfo(S.dtype).tiny)
                spectra_sum[(layer, key)] = spectra_sum.get((layer, key), 0) + \
                    normed.sum(0)
                counts[(layer, key)] = counts.get((layer, key), 0) + S.shape[0]
                if key in masks:
                    m['mask_rank'], m['mask_offdiag_max'] = (
                        t.cpu() for t in masks[key])
                if info.kind == 'mlla':
                    reach = stencil_reach(info, hw[1]) if key == 'whole' else 0
                    m['near_offdiag_max'], m['far_offdiag_max'] = near_far_ranks(
                        m['block_ranks'], chunk, reach)
                for head in range(S.shape[0]):
                    row = dict(image=image_index, layer=layer, key=key,
                               kind=info.kind, head=head, seqlen=S.shape[-1])
                    row.update({column: m[name][0, head].item()
                                for column, name in _RECORD_FIELDS.items()
                                if m.get(name) is not None})
                    records.append(row)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.file.write('\n')
    spectra = {f'{layer}/{key}': (total / counts[(layer, key)]).tolist()
               for (layer, key), total in spectra_sum.items()}
    summary = [_summarise(records, layer, key, infos[layer], chunk, widths[layer])
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


def _largest(rows: List[dict], column: str) -> Optional[int]:
    values = [r[column] for r in rows if r.get(column) is not None]
    return max(values) if values else None


def _summarise(records: List[dict], layer: int, key: str, info: MixerInfo,
               chunk: int, width: int) -> dict:
    rows = [r for r in records if r['layer'] == layer and r['key'] == key]
    seqlen = max(r['seqlen'] for r in rows)
    mask_rank = max(r['mask_rank'] for r in rows) if info.kind == 'ssd' else None
    bounds = offdiag_bounds(info, chunk, seqlen, mask_rank, key, width)
    ranks = [r['rank'] for r in rows]
    out = dict(
        layer=layer, key=key, kind=info.kind, nheads=len({r['head'] for r in rows}),
        seqlen=seqlen, chunk=chunk, d_qk=info.d_qk, rank_mean=float(np.mean(ranks)),
        rank_min=min(ranks), rank_max=max(ranks),
        effective_rank_mean=float(np.mean([r['effective_rank'] for r in rows])),
        diag_rank_min=min(r['diag_rank_min'] for r in rows),
        diag_rank_deficit_max=max(r['diag_rank_deficit_max'] for r in rows),
        offdiag_rank_max=max(r['offdiag_rank_max'] for r in rows),
        offdiag_rank_mean=float(np.mean([r['offdiag_rank_mean'] for r in rows])),
        **bounds,
        mask_rank_max=mask_rank,
        mask_offdiag_rank_max=(max(r['mask_offdiag_rank_max'] for r in rows)
                               if info.kind == 'ssd' else None),
        grid_width=width if info.grid else None,
        near_offdiag_rank_max=_largest(rows, 'near_offdiag_rank_max'),
        far_offdiag_rank_max=_largest(rows, 'far_offdiag_rank_max'))
    within = (out['offdiag_rank_max'] <= bounds['offdiag_bound_algebra']
              and out['rank_max'] <= bounds['global_bound'])
    for side in ('near', 'far'):
        rank, bound = out[f'{side}_offdiag_rank_max'], bounds[f'{side}_offdiag_bound']
        if rank is not None and bound is not None:
            within = within and rank <= bound
    out['within_bounds'] = bool(within)
    return out
