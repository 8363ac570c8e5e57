"""The report of :func:`mmdinomamba.studies.expressivity.sweep.run_sweep`.

Files under ``out_dir`` (each written atomically: a complete file or none):

- ``report.json``: everything measured (no matrices);
- ``report.md``: per kind of input and target, each family's
  ``[lower bound, best fit]`` against L, the orders the intervals decide, the
  off-diagonal block, the width and heads tables, and the evaluations each
  fit spent;
- ``error_vs_seqlen.png``: per target and kind of input with more than one L,
  the best fit against L, one curve per family, its lower bound dashed in its
  colour (not drawn, nor linked, when no target has two lengths);
- ``error_vs_width.png``: per target, the best fit and lower bound against the
  width and against the heads at one L (only when a sweep varies them);
- ``matrices.png``: the targets and every family's fitted matrix at one L.

matplotlib (Agg) is imported only when drawing.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional

import numpy as np

from mmdinomamba.utils import write_text_atomic
from mmdinomamba.analysis.figures import pyplot, save_figure
from .probe import FAMILIES

__all__ = ['decided_orders', 'format_markdown', 'write_expressivity_report']


def _base(results: dict):
    """The (width, heads) of the L curves: the first grid's first of each."""
    grid = results['meta']['grids'][0]
    return grid['widths'][0], grid['heads'][0]


def _rows(results: dict, **match) -> List[dict]:
    return [f for f in results['fits']
            if all(f.get(k, 'random' if k == 'inputs' else None) == v
                   for k, v in match.items())]


def _targets(results: dict) -> List[str]:
    return list(dict.fromkeys(f['target'] for f in results['fits']))


def _inputs(results: dict) -> List[str]:
    return list(dict.fromkeys(f.get('inputs', 'random') for f in results['fits']))


def _families(results: dict) -> List[str]:
    return list(results['meta']['families'])


def interval(row: dict, digits: int = 3) -> str:
    """``[lower bound, best fit]`` of a fit row, with "no fit" for a fit above
    1, a (c) where the fit is a contained family's, an (n) where the convergence
    rule stopped at its budget."""
    best = 'no fit' if row['best'] is None else f'{row["best"]:.{digits}f}'
    mark = (' (c)' if row.get('inherited_from') else '') + \
        ('' if row.get('converged', True) else ' (n)')
    return f'[{row["lower_bound"]:.{digits}f}, {best}]{mark}'


def decided_orders(rows: List[dict]) -> List[str]:
    """``'A < B'`` for each pair of fits whose intervals are apart: A's best fit
    below B's lower bound (so A's family reaches closer than B's can)."""
    out = []
    for a in rows:
        below = [b['family'] for b in rows
                 if a['best'] is not None and b is not a and a['best'] < b['lower_bound']]
        if below:
            out.append(f'{a["family"]} < ' + ', '.join(below))
    return out


def _length_table(results: dict, target: str, inputs: str) -> List[str]:
    width, heads = _base(results)
    rows = _rows(results, target=target, width=width, heads=heads, inputs=inputs)
    seqlens = sorted({r['seqlen'] for r in rows})
    if not seqlens:
        return []
    lines = ['| mixer | ' + ' | '.join(f'L = {L}' for L in seqlens) + ' |',
             '|---|' + '---|' * len(seqlens)]
    for family in _families(results):
        by_len = {r['seqlen']: r for r in rows if r['family'] == family}
        if by_len:
            lines.append(f'| {family} | ' + ' | '.join(
                interval(by_len[L]) if L in by_len else '—' for L in seqlens) + ' |')
    lines.append('')
    for L in seqlens:
        orders = decided_orders([r for r in rows if r['seqlen'] == L])
        lines.append(f'Decided at L = {L}: ' + ('; '.join(orders) if orders else
                                                 'no order') + '.')
        lines.append('')
    return lines


def _block_table(results: dict, target: str, inputs: str) -> List[str]:
    width, heads = _base(results)
    rows = [r for r in _rows(results, target=target, width=width, heads=heads,
                             inputs=inputs) if r['block_floor'] is not None]
    seqlens = sorted({r['seqlen'] for r in rows})
    if not seqlens:
        return []
    lines = ['| mixer | ' + ' | '.join(f'L = {L}' for L in seqlens) + ' |',
             '|---|' + '---|' * len(seqlens)]
    for family in _families(results):
        by_len = {r['seqlen']: r for r in rows if r['family'] == family}
        if by_len:
            lines.append(f'| {family} (rank {next(iter(by_len.values()))["block_rank"]})'
                         ' | ' + ' | '.join(
                             _pair(by_len[L]['block_floor'], by_len[L]['best_block'])
                             if L in by_len else '—' for L in seqlens) + ' |')
    return lines + ['']


def _pair(low: float, high: Optional[float]) -> str:
    return f'[{low:.3f}, ' + ('—' if high is None else f'{high:.3f}') + ']'


def _width_table(results: dict, target: str, axis: str) -> List[str]:
    """Intervals against width (at the base heads) or heads (at the base width)."""
    width, heads = _base(results)
    fixed = dict(heads=heads) if axis == 'width' else dict(width=width)
    rows = _rows(results, target=target, **fixed)
    lines = []
    for inputs in _inputs(results):
        at_inputs = [r for r in rows if r.get('inputs', 'random') == inputs]
        seqlens = sorted({r['seqlen'] for r in at_inputs if len(
            {x[axis] for x in at_inputs if x['seqlen'] == r['seqlen']}) > 1})
        for L in seqlens:
            at = [r for r in at_inputs if r['seqlen'] == L]
            values = sorted({r[axis] for r in at})
            held = f'heads {heads}' if axis == 'width' else f'width {width}'
            lines += [f'Against {axis} at L = {L} ({held}, {inputs} inputs):', '',
                      '| mixer | ' + ' | '.join(f'{axis} {v}' for v in values) + ' |',
                      '|---|' + '---|' * len(values)]
            for family in _families(results):
                by = {r[axis]: r for r in at if r['family'] == family}
                if by:
                    lines.append(f'| {family} | ' + ' | '.join(
                        interval(by[v]) if v in by else '—' for v in values) + ' |')
            lines.append('')
    return lines


def _curve_panels(results: dict) -> List[tuple]:
    """(target, inputs) with more than one L at the base width and heads."""
    width, heads = _base(results)
    return [(t, i) for i in _inputs(results) for t in _targets(results)
            if len({r['seqlen'] for r in _rows(results, target=t, width=width,
                                               heads=heads, inputs=i)}) > 1]


def _width_panels(results: dict) -> List[tuple]:
    width, heads = _base(results)
    panels = []
    for target in _targets(results):
        for axis, fixed in (('width', dict(heads=heads)), ('heads', dict(width=width))):
            for inputs in _inputs(results):
                rows = _rows(results, target=target, inputs=inputs, **fixed)
                for L in sorted({r['seqlen'] for r in rows}):
                    at = [r for r in rows if r['seqlen'] == L]
                    if len({r[axis] for r in at}) > 1:
                        panels.append((target, axis, L, inputs, at))
    return panels


def format_markdown(results: dict, title: str = 'Expressivity of token mixers',
                    figures: Optional[List[str]] = None) -> str:
    """The Markdown report (see the module docstring); ``figures``: the names
    of the figures written beside it (None: those the results can draw)."""
    meta = results['meta']
    width, heads = _base(results)
    budget = meta['budget']
    if figures is None:
        figures = (['error_vs_seqlen.png'] if _curve_panels(results) else []) + \
            (['error_vs_width.png'] if _width_panels(results) else []) + \
            (['matrices.png'] if results.get('matrices') else [])
    spent = sum(r.get('evaluations', 0) for r in results['fits'])
    unconverged = sum(1 for r in results['fits'] if not r.get('converged', True))
    lines = [
        f'# {title}', '',
        'Each cell is `[lower bound, best fit]` of the relative error '
        '`||M - T||_F / ||T||_F` of the mixer\'s own matrix M against the target '
        'T (`mmdinomamba.studies.expressivity.probe`): the family\'s best lies between '
        'the two. The lower bound is the largest certified floor of the family '
        '(Eckart-Young at its rank, equal row sums, the causal and semiseparable '
        'floors; `family_floors`); the best fit is the lowest error over the '
        'starts (constructive, warm from the previous L, random seeds) after the '
        'convergence rule (the best start goes on with its budget doubling until a '
        f'stage gains less than {meta.get("tol", 1e-3):g}). (c): the fit of a '
        'contained family (smaller width, fewer heads, the causal SSD in the '
        'bidirectional one, MLLA in MLLA with LePE), which this family holds; '
        '(n): stopped at the budget cap before converging; "no fit": the best '
        'fit was above 1, worse than the zero matrix. '
        f'Token features of width {meta["feature_dim"]} (seed {meta["seed"]}); '
        'evaluations of each start, random restarts and the most evaluations '
        'of a fit: ' + ', '.join(
            f'{tier[1]}, {tier[2]}, '
            f'{tier[3] if len(tier) > 3 else "16 x per start"} up to L = {tier[0]}'
            for tier in budget['tiers']) + '. '
        f'{meta["fits"]} fits, {spent} evaluations ({unconverged} not converged), '
        f'{meta["wall_seconds"] / 60:.1f} min ({meta["torch_threads"]} torch '
        'threads).', '',
        'An order "A < B" is stated only where the intervals decide it: A\'s '
        'best fit is below B\'s lower bound.', '',
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
    if 'error_vs_seqlen.png' in figures:
        lines += ['', '![error against L](error_vs_seqlen.png)']
    for inputs in _inputs(results):
        lines += ['', f'## {inputs.capitalize()} inputs (D_QK or N = {width}, '
                  f'{heads} head(s))', '']
        for target in _targets(results):
            table = _length_table(results, target, inputs)
            if table:
                lines += [f'### {target}', ''] + table
    block_lines = []
    for inputs in _inputs(results):
        for target in _targets(results):
            table = _block_table(results, target, inputs)
            if table:
                block_lines += [f'### {target}, {inputs} inputs', ''] + table
    if block_lines:
        lines += ['## The block strictly below the diagonal', '',
                  'Rows [L - L/2, L) x columns [0, L/2): `[rank floor of the block, '
                  'the best fit\'s block error]` for the families whose block rank '
                  'is bounded, on the targets whose block holds at least 1 % of '
                  'their energy.', ''] + block_lines
    width_lines = []
    for target in _targets(results):
        body = _width_table(results, target, 'width') + \
            _width_table(results, target, 'heads')
        if body:
            width_lines += [f'### {target}', ''] + body
    if width_lines:
        lines += ['## Width and heads', '']
        if 'error_vs_width.png' in figures:
            lines += ['![error against width and heads](error_vs_width.png)', '']
        lines += width_lines
    if 'matrices.png' in figures:
        lines += ['## The fitted matrices', '',
                  f'At L = {meta["show_seqlen"]}: each target, then each mixer\'s '
                  'fit (same colour scale per row).', '',
                  '![fitted matrices](matrices.png)', '']
    lines += ['## Evaluations', '',
              '| mixer | target | L | inputs | width | heads | best start | '
              'evaluations | converged |', '|---|---|---|---|---|---|---|---|---|']
    for r in results['fits']:
        lines.append(f'| {r["family"]} | {r["target"]} | {r["seqlen"]} | '
                     f'{r.get("inputs", "random")} | {r["width"]} | {r["heads"]} | '
                     f'{r.get("best_start")} | {r.get("evaluations")} | '
                     f'{"yes" if r.get("converged") else "no"} |')
    return '\n'.join(lines) + '\n'


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


def plot_error_vs_seqlen(results: dict, path: str) -> bool:
    """Draw the best fit and lower bound against L per (target, inputs) with
    more than one L; False (and no file) if there is none."""
    panels = _curve_panels(results)
    if not panels:
        return False
    plt = pyplot()
    width, heads = _base(results)
    colours = _colours(results)
    fig, axes = _panels(len(panels), plt)
    for ax, (target, inputs) in zip(axes, panels):
        for family in _families(results):
            rows = sorted(_rows(results, target=target, family=family, width=width,
                                heads=heads, inputs=inputs), key=lambda r: r['seqlen'])
            if not rows:
                continue
            colour = colours[family]
            fitted = [(r['seqlen'], r['best']) for r in rows if r['best'] is not None]
            if fitted:
                ax.plot(*zip(*fitted), marker='o', color=colour, label=family)
            ax.plot([r['seqlen'] for r in rows], [r['lower_bound'] for r in rows],
                    linestyle='--', color=colour, linewidth=1)
        ax.set_xscale('log', base=2)
        ax.set_xlabel('L (tokens)')
        ax.set_ylabel('relative error (dashed: lower bound)')
        ax.set_ylim(bottom=0)
        ax.set_title(f'{target}, {inputs} inputs', fontsize=10)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_error_vs_width(results: dict, path: str) -> bool:
    """Draw the width and heads panels; False (and no file) if the sweep has
    none."""
    panels = _width_panels(results)
    if not panels:
        return False
    plt = pyplot()
    colours = _colours(results)
    fig, axes = _panels(len(panels), plt)
    for ax, (target, axis, L, inputs, at) in zip(axes, panels):
        for family in _families(results):
            rows = sorted([r for r in at if r['family'] == family],
                          key=lambda r: r[axis])
            if not rows:
                continue
            fitted = [(r[axis], r['best']) for r in rows if r['best'] is not None]
            if fitted:
                ax.plot(*zip(*fitted), marker='o', color=colours[family], label=family)
            ax.plot([r[axis] for r in rows], [r['lower_bound'] for r in rows],
                    linestyle='--', color=colours[family], linewidth=1)
        ax.set_xscale('log', base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel('relative error (dashed: lower bound)')
        ax.set_ylim(bottom=0)
        ax.set_title(f'{target}, L = {L}, {inputs}', fontsize=10)
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
    """Write the report files (module docstring) under ``out_dir``; a figure
    with nothing to draw is neither written nor linked (an old copy of it in
    ``out_dir`` is removed, so the folder holds this report's files only).

    Returns:
        dict: file name -> path.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: osp.join(out_dir, name) for name in (
        'report.json', 'report.md', 'error_vs_seqlen.png', 'error_vs_width.png',
        'matrices.png')}
    drawn = dict(error_vs_seqlen=plot_error_vs_seqlen(
        results, paths['error_vs_seqlen.png']),
        error_vs_width=plot_error_vs_width(results, paths['error_vs_width.png']),
        matrices=bool(results.get('matrices')))
    if drawn['matrices']:
        plot_matrices(results, paths['matrices.png'])
    for name, ok in drawn.items():
        if not ok:
            stale = paths.pop(f'{name}.png')
            if osp.exists(stale):
                os.remove(stale)
    stale = osp.join(out_dir, 'block_error_vs_seqlen.png')
    if osp.exists(stale):
        os.remove(stale)
    figures = [n for n in paths if n.endswith('.png')]
    write_text_atomic(paths['report.json'],
                      json.dumps(_json_ready(results), indent=1))
    write_text_atomic(paths['report.md'], format_markdown(results, title, figures))
    return paths
