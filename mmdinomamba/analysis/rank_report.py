"""Tables and plots of a rank analysis (:class:`~.mixing_rank.RankReport`).

Every file is written to a temporary name and renamed into place; matplotlib
(Agg) is imported only when drawing.
"""
import csv
import io
import json
import os.path as osp
from typing import Dict, List, Sequence

import numpy as np

from mmdinomamba.utils import write_text_atomic
from .figures import pyplot, save_figure
from .mixing_rank import RECORD_COLUMNS, SUMMARY_COLUMNS, RankReport

__all__ = ['format_table', 'plot_rank_vs_layer', 'plot_spectra', 'write_report']


def format_table(summary: List[dict]) -> str:
    """A Markdown table of the summary (one row per layer and matrix).

    ``near / far`` are the largest ranks of the off-diagonal blocks within and
    beyond the reach of a local stencil, with their bounds (MLLA's mixer only).
    """
    head = ('| layer | matrix | heads | L | rank mean [min, max] | eff. rank | '
            'diag deficit | off-diag max (mean) | bound: algebra | bound: paper | '
            'near / far (bounds) |')
    lines = [head, '|' + '---|' * (head.count('|') - 1)]
    for s in summary:
        name = s['key'] if s['key'] != 'attention' else s['kind']
        paper = s['offdiag_bound_paper']
        if s['kind'] == 'ssd':
            paper = f'{paper} = {s["mask_rank_max"]} x {s["d_qk"]}'
        near_far = '-'
        if s.get('near_offdiag_bound') is not None:
            near, far = (s[f'{side}_offdiag_rank_max'] for side in ('near', 'far'))
            near_far = (f"{'-' if near is None else near} / "
                        f"{'-' if far is None else far} "
                        f"({s['near_offdiag_bound']} / {s['far_offdiag_bound']})")
        lines.append(
            f"| {s['layer']} | {name} | {s['nheads']} | {s['seqlen']} | "
            f"{s['rank_mean']:.1f} [{s['rank_min']}, {s['rank_max']}] | "
            f"{s['effective_rank_mean']:.1f} | {s['diag_rank_deficit_max']} | "
            f"{s['offdiag_rank_max']} ({s['offdiag_rank_mean']:.1f}) | "
            f"{s['offdiag_bound_algebra']} | {paper} | {near_far} |")
    return '\n'.join(lines)


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
    seqlen = max(s['seqlen'] for s in report.summary)
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
        bounds = [s['offdiag_bound_algebra'] for s in rows]
        algebra = max(bounds)
        if len(set(bounds)) == 1:
            ax_o.axhline(algebra, color=colour, ls=':', lw=1.2,
                         label=f'{name}: bound {algebra}')
        else:  # per layer (the stages of a hierarchical backbone)
            ax_o.plot(x, bounds, ':', color=colour, lw=1.2, label=f'{name}: bound')
        paper = max(s['offdiag_bound_paper'] for s in rows)
        if paper != algebra:
            notes.append((rows[0]['kind'], paper))
        top_o = max(top_o, algebra, max(s['offdiag_rank_max'] for s in rows))
    lengths = {s['layer']: s['seqlen'] for s in report.summary}
    if len(set(lengths.values())) == 1:
        ax_g.axhline(seqlen, color='k', ls=':', lw=1, label=f'L = {seqlen}')
    else:  # stages of a hierarchical backbone
        ax_g.plot(list(lengths), list(lengths.values()), 'k:', lw=1, label='L')
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
    write_text_atomic(paths['json'], json.dumps(
        dict(meta=report.meta, summary=report.summary, records=report.records,
             spectra=report.spectra), indent=1))
    write_text_atomic(paths['summary_csv'], _csv_text(report.summary, SUMMARY_COLUMNS))
    write_text_atomic(paths['heads_csv'], _csv_text(report.records, RECORD_COLUMNS))
    write_text_atomic(paths['table'], format_table(report.summary) + '\n')
    plot_spectra(report, paths['spectra_png'], title)
    plot_rank_vs_layer(report, paths['rank_png'], title)
    return paths
