"""The report of :func:`mmdinomamba.studies.comparison.measures.compare_models`.

Files under ``out_dir`` (each written atomically: a complete file or none):

- ``report.json``: everything measured (no image arrays), with the per-image
  values behind every paired statistic (``models[i].per_image``,
  ``reference.centred_gaussian.per_image``; null where an image has no
  foreground or background);
- ``report.md``: one table of the models side by side (k-NN, probe, and for each
  kind of activation map the Binary-AUC of the last block and the best block),
  the reference maps (the centre prior, each network's map of a flat grey
  image) and each model's paired gain over them, the paired gains of the
  pairs and between the models (with "better", "worse" or "tie" as the
  interval says), per-layer Binary-AUC and rank tables, and links to the
  figures;
- ``auc_vs_depth.png``: Binary-AUC (mean over heads) against block index, every
  model on one axis (one panel per kind of map), with its 95 % bootstrap band
  over images;
- ``rank_vs_depth.png``: global rank, effective rank and largest off-diagonal block
  rank of the mixing matrix against block index, every model, with bands and the
  bounds (dashed);
- ``activation_maps.png``: the same validation images (rows), their masks, and
  each model's head-mean activation map of its last block (columns), of the
  first kind of map.

matplotlib (Agg) is imported only when drawing.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional

import numpy as np

from mmdinomamba.utils import write_text_atomic
from mmdinomamba.analysis.figures import pyplot, save_figure

__all__ = ['format_markdown', 'write_comparison_report']

FIGURES = ('auc_vs_depth.png', 'rank_vs_depth.png', 'activation_maps.png')
MAP_WORDS = {
    'cosine': 'the cosine map of the readout token against every patch',
    'attention': "the readout's row of the mixing matrix at the patches (softmax "
                 'and linear attention: the attention map; SSD: the bidirectional '
                 "'combined' matrix; MLLA: the mean row of its attention part)",
}




def _ci(c: Optional[dict], scale: float = 1.0, digits: int = 3, sign: str = '') -> str:
    """``mean [low, high]``; ``sign='+'`` writes the sign of each (for gains)."""
    if c is None:
        return '—'
    return (f'{c["mean"] * scale:{sign}.{digits}f} [{c["low"] * scale:{sign}.{digits}f}, '
            f'{c["high"] * scale:{sign}.{digits}f}]')


def _gain(c: Optional[dict], scale: float = 1.0, digits: int = 3) -> str:
    """A paired gain with its sign and the order its interval decides."""
    from .measures import order_word
    if c is None:
        return '—'
    return f'{_ci(c, scale, digits, "+")} {order_word(c)}'


def _probe(m: dict) -> str:
    """The probe's top-1 over the held-out images, or the one its own run
    printed (no interval) when the report does not score it."""
    if m.get('probe') is not None:
        return _ci(m['probe'], 100, 1)
    if m.get('probe_logged') is not None:
        return f'{100 * m["probe_logged"]:.1f} (its run\'s validation)'
    return '—'


def format_markdown(results: dict, title: str = 'Token mixers side by side') -> str:
    """The Markdown report (see the module docstring)."""
    meta = results['meta']
    methods = results['meta']['map_methods']
    maps = '; '.join(f'*{k}*: {MAP_WORDS[k]}' for k in methods)
    auc_heads = ''.join(f'Binary-AUC ({k} map), last block | best block | '
                        for k in methods)
    lines = [f'# {title}', '',
             f'{meta["num_val"]} validation images with masks, {meta["num_train"]} '
             f'training images as the k-NN bank, {meta["image_size"][0]} px. '
             f'k-NN: cosine, k = {meta["k"]}, T = {meta["temperature"]}, on the last '
             f'block\'s readout. Binary-AUC of activation maps ({maps}), per '
             'head, exact AUC, mean over heads then over images. '
             f'Intervals: {int(meta["level"] * 100)} % percentile bootstrap over '
             f'images ({meta["num_resamples"]} resamples, seed {meta["seed"]}). '
             f'Ranks: on {meta["rank_images"]} images, chunk c = {meta["chunk"]}.',
             '', '| model | mixer | checkpoint | k-NN top-1 | linear probe top-1 | '
             f'{auc_heads}',
             '|---|---|---|---|---|' + '---|---|' * len(methods)]
    for m in results['models']:
        cells = ''
        for k in methods:
            rows = m['auc_by_method'][k]
            best = max(rows, key=lambda r: r['auc']['mean'])
            cells += (f'{_ci(rows[-1]["auc"])} | '
                      f'{_ci(best["auc"])} (block {best["layer"]}) | ')
        lines.append(
            f'| {m["name"]} | {m["kind"]} | {m["checkpoint"] or "random init"} | '
            f'{_ci(m["knn"], 100, 1)} | {_probe(m)} | {cells}')
    reference = results.get('reference')
    if reference:
        prior = reference['centred_gaussian']
        lines += ['', '## Reference maps (last block)', '',
                  'What a map scores without the network\'s reading of the image: '
                  f'the centre prior (a fixed centred Gaussian, sigma '
                  f'{prior["sigma"]:g} of the side, the same map for every image: '
                  f'Binary-AUC {_ci(prior["auc"])}) and the map of a flat grey '
                  'image through the same network (the same map for every image). '
                  'Each model\'s gain over them is paired: the per-image difference '
                  'on the same images, with its bootstrap interval; the order word '
                  'follows the interval ("tie" where it includes 0).', '',
                  '| model | ' + ''.join(
                      f'grey-image map AUC ({k}) | gain over it | gain over the '
                      f'centre prior | ' for k in methods),
                  '|---|' + '---|---|---|' * len(methods)]
        lines.append('| *centre prior* | ' + ''.join(
            f'{_ci(prior["auc"])} (same for all) | — | — | ' for _ in methods))
        for m in results['models']:
            ref = m.get('reference') or {}
            cells = ''
            for k in methods:
                r = ref.get(k)
                if r is None:
                    cells += '— | — | — | '
                    continue
                cells += (f'{_ci(r["grey"])} | {_gain(r["gain_over_grey"])} | '
                          f'{_gain(r["gain_over_prior"])} | ')
            lines.append(f'| {m["name"]} | {cells}')
    if results.get('pairs'):
        lines += ['', '## Paired gains (last block)', '',
                  'Each model against its base on the same images: the mean '
                  'per-image difference and its bootstrap interval, the images '
                  'resampled together.', '',
                  '| model | over | k-NN gain (points) | ' +
                  ''.join(f'Binary-AUC gain ({k} map) | ' for k in methods),
                  '|---|---|---|' + '---|' * len(methods)]
        by_name = {m['name']: m for m in results['models']}
        extra = bool(reference)
        if extra:
            lines[-2] += ''.join(f'{k} map: model\'s gain over the centre prior | '
                                 for k in methods)
            lines[-1] += '---|' * len(methods)
        for pair in results['pairs']:
            ref = by_name[pair['model']].get('reference') or {}
            lines.append(f'| {pair["model"]} | {pair["base"]} | '
                         f'{_gain(pair["knn"], 100, 1)} | ' +
                         ''.join(f'{_gain(pair["auc"][k])} | ' for k in methods) +
                         (''.join(f'{_gain(ref[k]["gain_over_prior"])} | '
                                  if k in ref else '— | ' for k in methods)
                          if extra else ''))
    if results.get('between'):
        lines += ['', '## Between the models (last block, paired)', '',
                  'Each row: the first model\'s gain over the second on the same '
                  'images; "better" or "worse" only where the interval excludes 0.',
                  '', '| model | against | k-NN gain (points) | ' +
                  ''.join(f'Binary-AUC gain ({k} map) | ' for k in methods),
                  '|---|---|---|' + '---|' * len(methods)]
        for pair in results['between']:
            lines.append(f'| {pair["model"]} | {pair["base"]} | '
                         f'{_gain(pair["knn"], 100, 1)} | ' +
                         ''.join(f'{_gain(pair["auc"][k])} | ' for k in methods))
    lines += ['', '![Binary-AUC against depth](auc_vs_depth.png)', '']
    for k in methods:
        lines += [f'## Binary-AUC by block, {k} map (mean over heads; head-mean '
                  'map; heads)', '']
        for m in results['models']:
            lines += [f'### {m["name"]}', '', '| block | AUC | head-mean map AUC | '
                      'per head |', '|---|---|---|---|']
            for r in m['auc_by_method'][k]:
                heads = ', '.join(f'{h:.3f}' for h in r['heads'])
                lines.append(f'| {r["layer"]} | {_ci(r["auc"])} | '
                             f'{_ci(r["mean_map_auc"])} | {heads} |')
            lines.append('')
    if any(m['ranks'] for m in results['models']):
        lines += ['## Mixing-matrix ranks by block', '',
                  'Mean over heads and images; the bounds are the paper\'s '
                  '(mmdinomamba.analysis.mixing_rank.offdiag_bounds): whole '
                  'matrix, and an off-diagonal block (algebra / paper).', '',
                  '![Ranks against depth](rank_vs_depth.png)', '',
                  '| model | block | matrix | L | rank | bound | effective rank | '
                  'off-diag block max | bound algebra / paper | within |',
                  '|---|---|---|---|---|---|---|---|---|---|']
        for m in results['models']:
            for r in m['ranks']:
                lines.append(
                    f'| {m["name"]} | {r["layer"]} | {r["kind"]}/{r["key"]} | '
                    f'{r["seqlen"]} | {_ci(r["rank_ci"], digits=1)} | '
                    f'{r["global_bound"]} | {_ci(r["effective_rank_ci"], digits=1)} | '
                    f'{_ci(r["offdiag_rank_max_ci"], digits=1)} | '
                    f'{r["offdiag_bound_algebra"]} / {r["offdiag_bound_paper"]} | '
                    f'{"yes" if r["within_bounds"] else "NO"} |')
        lines.append('')
    lines += [f'## Activation maps of the same images ({methods[0]} map)', '',
              '![Activation maps](activation_maps.png)', '',
              'Images: ' + ', '.join(meta['map_paths']), '']
    return '\n'.join(lines)


def _plain(value):
    """numpy arrays and numbers as JSON values: lists, floats, nan as null."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (float, np.floating)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _json_ready(results: dict) -> dict:
    out = dict(meta=results['meta'], models=[], pairs=results.get('pairs', []),
               between=results.get('between', []))
    if results.get('reference'):
        out['reference'] = results['reference']
    for m in results['models']:
        out['models'].append({k: v for k, v in m.items() if k != 'map_images'})
    return _plain(out)


def _band(ax, xs, cis, label, colour):
    means = [c['mean'] for c in cis]
    ax.plot(xs, means, marker='o', label=label, color=colour)
    ax.fill_between(xs, [c['low'] for c in cis], [c['high'] for c in cis],
                    color=colour, alpha=0.2)


def plot_auc_vs_depth(results: dict, path: str) -> None:
    plt = pyplot()
    methods = results['meta']['map_methods']
    fig, axes = plt.subplots(1, len(methods), figsize=(6 * len(methods), 4),
                             squeeze=False)
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for ax, method in zip(axes[0], methods):
        for n, m in enumerate(results['models']):
            rows = m['auc_by_method'][method]
            _band(ax, [r['layer'] for r in rows], [r['auc'] for r in rows],
                  m['name'], colours[n % len(colours)])
        ax.axhline(0.5, color='grey', linestyle=':', linewidth=1)
        ax.set_xlabel('block')
        ax.set_ylabel('Binary-AUC (mean over heads)')
        ax.set_title(f'{method} map: Binary-AUC against depth (95 % band)',
                     fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def plot_rank_vs_depth(results: dict, path: str) -> None:
    plt = pyplot()
    panels = (('rank_ci', 'global_bound', 'global rank'),
              ('effective_rank_ci', None, 'effective rank'),
              ('offdiag_rank_max_ci', 'offdiag_bound_algebra',
               'largest off-diagonal block rank'))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for ax, (key, bound, label) in zip(axes, panels):
        for n, m in enumerate(results['models']):
            if not m['ranks']:
                continue
            colour = colours[n % len(colours)]
            xs = [r['layer'] for r in m['ranks']]
            _band(ax, xs, [r[key] for r in m['ranks']], m['name'], colour)
            if bound is not None:
                ax.plot(xs, [r[bound] for r in m['ranks']], linestyle='--',
                        color=colour, linewidth=1)
        ax.set_xlabel('block')
        ax.set_title(label + (' (dashed: bound)' if bound else ''))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def plot_activation_maps(results: dict, images: np.ndarray, masks: np.ndarray,
                         path: str) -> None:
    """Rows: images; columns: image, mask, each model's head-mean map."""
    plt = pyplot()
    models = results['models']
    rows = min(len(images), *(len(m['map_images']) for m in models))
    cols = 2 + len(models)
    fig, axes = plt.subplots(rows, cols, figsize=(1.8 * cols, 1.8 * rows),
                             squeeze=False)
    for i in range(rows):
        axes[i, 0].imshow(images[i])
        axes[i, 1].imshow(masks[i] > 0, cmap='gray')
        for j, m in enumerate(models):
            axes[i, 2 + j].imshow(m['map_images'][i], cmap='viridis')
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    for j, name in enumerate(['image', 'mask'] + [m['name'] for m in models]):
        axes[0, j].set_title(name, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def write_comparison_report(results: dict, out_dir: str, images: np.ndarray,
                            masks: np.ndarray,
                            title: str = 'Token mixers side by side'
                            ) -> Dict[str, str]:
    """Write the report files (module docstring) under ``out_dir``.

    Args:
        results (dict): :func:`~mmdinomamba.studies.comparison.measures.compare_models`.
        out_dir (str): output folder (created).
        images (np.ndarray): (num, height, width, 3) in [0, 1], the images of
            ``results['meta']['map_paths']`` for display.
        masks (np.ndarray): (num, height, width) their label maps.
        title (str): report title.

    Returns:
        dict: file kind -> path.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: osp.join(out_dir, name) for name in
             ('report.json', 'report.md') + FIGURES}

    write_text_atomic(paths['report.json'],
                      json.dumps(_json_ready(results), indent=1,
                                 allow_nan=False))
    write_text_atomic(paths['report.md'], format_markdown(results, title))
    plot_auc_vs_depth(results, paths['auc_vs_depth.png'])
    if any(m['ranks'] for m in results['models']):
        plot_rank_vs_depth(results, paths['rank_vs_depth.png'])
    else:
        del paths['rank_vs_depth.png']
    plot_activation_maps(results, images, masks, paths['activation_maps.png'])
    return paths


def display(images) -> List[np.ndarray]:
    """Normalised (num, 3, h, w) tensors -> (num, h, w, 3) in [0, 1] for display."""
    from mmdinomamba.analysis.images import DEFAULT_PREPROCESSOR
    x = images.detach().cpu().float().permute(0, 2, 3, 1).numpy()
    std, mean = DEFAULT_PREPROCESSOR['std'], DEFAULT_PREPROCESSOR['mean']
    return np.clip((x * np.array(std) + np.array(mean)) / 255, 0, 1)
