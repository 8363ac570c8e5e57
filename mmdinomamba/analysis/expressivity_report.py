"""The report of :func:`mmdinomamba.analysis.expressivity_sweep.run_sweep`.

Files under ``out_dir`` (each written atomically: a complete file or none):

- ``report.json``: everything measured (no matrices);
- ``report.md``: per target, the best relative error of every family against L
  next to the floors, the same for the block strictly below the diagonal, and
  the width and heads tables;
- ``error_vs_seqlen.png``: per target, the relative error against L, one curve
  per family (the best restart; the band spans the restarts), each low-rank
  family's rank floor dashed in its colour, the causal floor of a causal
  family dotted;
- ``block_error_vs_seqlen.png``: the same for the off-diagonal block, with the
  rank floors of the families whose blocks are low rank (SSD: N per head);
- ``error_vs_width.png``: per target, the error against the width and against
  the heads at one L, with the floors;
- ``matrices.png``: the targets and every family's fitted matrix at one L.

matplotlib (Agg) is imported only when drawing.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional

import numpy as np

from mmdinomamba.utils import write_text_atomic
from .expressivity import FAMILIES
from .figures import pyplot, save_figure

__all__ = ['format_markdown', 'write_expressivity_report']


def _base(results: dict):
    """The (width, heads) of the L curves: the first grid's first of each."""
    grid = results['meta']['grids'][0]
    return grid['widths'][0], grid['heads'][0]


def _rows(results: dict, **match) -> List[dict]:
    return [f for f in results['fits'] if all(f[k] == v for k, v in match.items())]


def _targets(results: dict) -> List[str]:
    return list(dict.fromkeys(f['target'] for f in results['fits']))


def _families(results: dict) -> List[str]:
    return list(results['meta']['families'])


def _cell(summary: dict, digits: int = 3) -> str:
    if summary['best'] is None:
        return '—'
    if summary['worst'] - summary['best'] > 0.5 * 10 ** -digits:
        return (f'{summary["best"]:.{digits}f} '
                f'({summary["best"]:.{digits}f}-{summary["worst"]:.{digits}f})')
    return f'{summary["best"]:.{digits}f}'


def _floor(value: Optional[float]) -> str:
    return '—' if value is None else f'{value:.3f}'


def _length_table(results: dict, target: str, block: bool) -> List[str]:
    width, heads = _base(results)
    rows = _rows(results, target=target, width=width, heads=heads)
    seqlens = sorted({r['seqlen'] for r in rows})
    if not seqlens:
        return []
    key = 'block_error' if block else 'error'
    lines = ['| mixer | ' + ' | '.join(f'L = {L}' for L in seqlens) + ' |',
             '|---|' + '---|' * len(seqlens)]
    floors = {}
    for family in _families(results):
        by_len = {r['seqlen']: r for r in rows if r['family'] == family}
        if not by_len:
            continue
        lines.append(f'| {family} | ' + ' | '.join(
            _cell(by_len[L][key]) if L in by_len else '—' for L in seqlens) + ' |')
        rank_key, floor_key = ('block_rank', 'block_floor') if block else \
            ('rank', 'floor')
        for L, r in by_len.items():
            if r[floor_key] is not None:
                floors.setdefault(r[rank_key], {})[L] = r[floor_key]
    for rank, by_len in sorted(floors.items()):
        lines.append(f'| *rank-{rank} floor* | ' + ' | '.join(
            _floor(by_len.get(L)) for L in seqlens) + ' |')
    if not block:
        causal = {t['seqlen']: t['causal_floor'] for t in results['targets']
                  if t['target'] == target}
        lines.append('| *causal floor* | ' + ' | '.join(
            _floor(causal.get(L)) for L in seqlens) + ' |')
    return lines


def _width_table(results: dict, target: str, axis: str) -> List[str]:
    """Errors against width (at the base heads) or heads (at the base width)."""
    width, heads = _base(results)
    fixed = dict(heads=heads) if axis == 'width' else dict(width=width)
    rows = [r for r in _rows(results, target=target, **fixed)]
    seqlens = sorted({r['seqlen'] for r in rows
                      if len({x[axis] for x in rows if x['seqlen'] == r['seqlen']}) > 1})
    lines = []
    for L in seqlens:
        at = [r for r in rows if r['seqlen'] == L]
        values = sorted({r[axis] for r in at})
        held = f'heads {heads}' if axis == 'width' else f'width {width}'
        lines += [f'Against {axis} at L = {L} ({held}):', '',
                  '| mixer | ' + ' | '.join(f'{axis} {v}' for v in values) + ' |',
                  '|---|' + '---|' * len(values)]
        floors = {}
        for family in _families(results):
            by = {r[axis]: r for r in at if r['family'] == family}
            lines.append(f'| {family} | ' + ' | '.join(
                _cell(by[v]['error']) if v in by else '—' for v in values) + ' |')
            for v, r in by.items():
                if r['floor'] is not None:
                    floors[v] = (r['rank'], r['floor'])
        if floors:
            lines.append('| *floor of linear (rank)* | ' + ' | '.join(
                f'{floors[v][1]:.3f} ({floors[v][0]})' if v in floors else '—'
                for v in values) + ' |')
        lines.append('')
    return lines


def format_markdown(results: dict, title: str = 'Expressivity of token mixers') -> str:
    """The Markdown report (see the module docstring)."""
    meta = results['meta']
    width, heads = _base(results)
    budget = meta['budget']
    lines = [
        f'# {title}', '',
        'Relative error `||M - T||_F / ||T||_F` of each mixer\'s own matrix M, '
        'fitted to the target T (`mmdinomamba.analysis.expressivity`): the best '
        'restart, with the range over restarts in brackets where they differ. '
        f'Fixed token features of width {meta["feature_dim"]} (seed {meta["seed"]}); '
        'evaluations and restarts per fit: ' + ', '.join(
            f'{steps} x {restarts} up to L = {max_seqlen}'
            for max_seqlen, steps, restarts in budget['tiers']) +
        ' (restart 0 warm-started from the fit at the previous L). '
        'Floors (closed form, from '
        '`torch.linalg.svdvals`): no matrix of rank r comes closer than the rank-r '
        'floor (linear attention: r = heads x D_QK), no lower-triangular matrix '
        'closer than the causal floor. '
        f'{meta["fits"]} fits in {meta["wall_seconds"] / 60:.1f} min '
        f'({meta["torch_threads"]} torch threads).', '',
        '| mixer | what |', '|---|---|']
    lines += [f'| {name} | {text} |' for name, text in meta['families'].items()]
    lines += ['', '| target | what |', '|---|---|']
    lines += [f'| {name} | {text} |'
              for name, text in meta['target_descriptions'].items()]
    if meta.get('trained_attention'):
        ta = meta['trained_attention']
        lines += ['', f'trained_attention: layer {ta["layer"]}, head {ta["head"]} of '
                  f'`{ta["config"]}` with `{ta["checkpoint"]}`, '
                  f'image {ta["image"]}, patches only.']
    lines += ['', f'## Error against L (D_QK or N = {width}, {heads} head(s))', '',
              '![error against L](error_vs_seqlen.png)', '']
    for target in _targets(results):
        table = _length_table(results, target, block=False)
        if table:
            lines += [f'### {target}', ''] + table + ['']
    lines += ['## The block strictly below the diagonal', '',
              'Rows [L - L/2, L) x columns [0, L/2): relative error of the fitted '
              "matrix's block, and the rank floors of that block (SSD: N per head; "
              'linear attention: D_QK per head); for the targets whose block holds '
              'at least 1 % of their energy.', '',
              '![block error against L](block_error_vs_seqlen.png)', '']
    for target in _targets(results):
        table = _length_table(results, target, block=True)
        if table:
            lines += [f'### {target}', ''] + table + ['']
    width_lines = []
    for target in _targets(results):
        body = _width_table(results, target, 'width') + \
            _width_table(results, target, 'heads')
        if body:
            width_lines += [f'### {target}', ''] + body
    if width_lines:
        lines += ['## Width and heads', '', '![error against width and heads]'
                  '(error_vs_width.png)', ''] + width_lines
    if results.get('matrices'):
        lines += ['## The fitted matrices', '',
                  f'At L = {meta["show_seqlen"]}: each target, then each mixer\'s '
                  'fit (same colour scale per row).', '',
                  '![fitted matrices](matrices.png)', '']
    return '\n'.join(lines)


def _colours(results: dict) -> Dict[str, str]:
    plt = pyplot()
    cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
    return {f: cycle[i % len(cycle)] for i, f in enumerate(_families(results))}


def _panels(n: int, plt, height: float = 3.2):
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, height * rows),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def plot_error_vs_seqlen(results: dict, path: str, block: bool = False) -> None:
    plt = pyplot()
    width, heads = _base(results)
    targets = [t for t in _targets(results)
               if len({r['seqlen'] for r in _rows(results, target=t, width=width,
                                                  heads=heads)}) > 1]
    colours = _colours(results)
    key, rank_key, floor_key = (('block_error', 'block_rank', 'block_floor') if block
                                else ('error', 'rank', 'floor'))
    fig, axes = _panels(max(1, len(targets)), plt)
    for ax, target in zip(axes, targets):
        for family in _families(results):
            rows = sorted(_rows(results, target=target, family=family, width=width,
                                heads=heads), key=lambda r: r['seqlen'])
            rows = [r for r in rows if r[key]['best'] is not None]
            if not rows:
                continue
            xs = [r['seqlen'] for r in rows]
            colour = colours[family]
            ax.plot(xs, [r[key]['best'] for r in rows], marker='o', color=colour,
                    label=family)
            ax.fill_between(xs, [r[key]['best'] for r in rows],
                            [r[key]['worst'] for r in rows], color=colour, alpha=0.2)
            floors = [(r['seqlen'], r[floor_key]) for r in rows
                      if r[floor_key] is not None]
            if floors:
                ax.plot(*zip(*floors), linestyle='--', color=colour, linewidth=1,
                        label=f'rank-{rows[0][rank_key]} floor')
            if not block and FAMILIES[family].causal:
                causal = {t['seqlen']: t['causal_floor'] for t in results['targets']
                          if t['target'] == target}
                ax.plot(xs, [causal[x] for x in xs], linestyle=':', color=colour,
                        linewidth=1, label='causal floor')
        ax.set_xscale('log', base=2)
        ax.set_xlabel('L (tokens)')
        ax.set_ylabel('relative error' + (' (off-diagonal block)' if block else ''))
        ax.set_ylim(bottom=0)
        ax.set_title(target, fontsize=10)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)


def plot_error_vs_width(results: dict, path: str) -> bool:
    """Draw the width and heads panels; False (and no file) if the sweep has
    none."""
    plt = pyplot()
    width, heads = _base(results)
    colours = _colours(results)
    panels = []
    for target in _targets(results):
        for axis, fixed in (('width', dict(heads=heads)), ('heads', dict(width=width))):
            rows = _rows(results, target=target, **fixed)
            for L in sorted({r['seqlen'] for r in rows}):
                at = [r for r in rows if r['seqlen'] == L]
                if len({r[axis] for r in at}) > 1:
                    panels.append((target, axis, L, at))
    if not panels:
        return False
    fig, axes = _panels(len(panels), plt)
    for ax, (target, axis, L, at) in zip(axes, panels):
        for family in _families(results):
            rows = sorted([r for r in at if r['family'] == family],
                          key=lambda r: r[axis])
            if not rows:
                continue
            xs = [r[axis] for r in rows]
            ax.plot(xs, [r['error']['best'] for r in rows], marker='o',
                    color=colours[family], label=family)
            floors = [(r[axis], r['floor']) for r in rows if r['floor'] is not None]
            if floors:
                ax.plot(*zip(*floors), linestyle='--', color=colours[family],
                        linewidth=1, label='rank floor')
        ax.set_xscale('log', base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel('relative error')
        ax.set_ylim(bottom=0)
        ax.set_title(f'{target}, L = {L}', fontsize=10)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_matrices(results: dict, path: str) -> None:
    plt = pyplot()
    matrices = results['matrices']
    families = _families(results)
    rows = list(matrices.items())
    cols = 1 + len(families)
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.9 * cols, 1.9 * len(rows)),
                             squeeze=False)
    for i, ((target, _), mats) in enumerate(rows):
        T = mats['target'].numpy()
        low, high = float(np.min(T)), float(np.max(T))
        for j, name in enumerate(['target'] + families):
            ax = axes[i, j]
            if name in mats:
                ax.imshow(mats[name].numpy(), cmap='viridis', vmin=low, vmax=high)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(name, fontsize=7)
        axes[i, 0].set_ylabel(target, fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def _json_ready(results: dict) -> dict:
    return {k: v for k, v in results.items() if k != 'matrices'}


def write_expressivity_report(results: dict, out_dir: str,
                              title: str = 'Expressivity of token mixers'
                              ) -> Dict[str, str]:
    """Write the report files (module docstring) under ``out_dir``.

    Returns:
        dict: file name -> path (figures with nothing to draw are left out).
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: osp.join(out_dir, name) for name in (
        'report.json', 'report.md', 'error_vs_seqlen.png',
        'block_error_vs_seqlen.png', 'error_vs_width.png', 'matrices.png')}

    write_text_atomic(paths['report.json'],
                      json.dumps(_json_ready(results), indent=1))
    write_text_atomic(paths['report.md'], format_markdown(results, title))
    plot_error_vs_seqlen(results, paths['error_vs_seqlen.png'])
    plot_error_vs_seqlen(results, paths['block_error_vs_seqlen.png'], block=True)
    if not plot_error_vs_width(results, paths['error_vs_width.png']):
        del paths['error_vs_width.png']
    if results.get('matrices'):
        plot_matrices(results, paths['matrices.png'])
    else:
        del paths['matrices.png']
    return paths
