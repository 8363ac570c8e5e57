"""The expressivity probe: fit each token mixer's own matrix to known targets.

Writes ``report.md``, ``report.json`` and the figures ``error_vs_seqlen.png``,
``error_vs_width.png`` and ``matrices.png`` (those with something to draw) to
``--out-dir`` (see docs/expressivity.md)::

    OMP_NUM_THREADS=1 python tools/analysis/expressivity.py \\
        --out-dir docs/images/expressivity

Without ``--grid`` the sweep is ``DEFAULT_GRIDS``
(:mod:`mmdinomamba.studies.expressivity.sweep`). ``--grid TARGETS SEQLENS WIDTHS
HEADS`` (comma-separated lists, repeatable) replaces it, e.g.
``--grid permutation,band_1d 64,128 16 1``, with the inputs of ``--inputs``
(``random``, ``positional`` or both). The 'trained_attention' target needs
``--attention-config`` and ``--attention-checkpoint``: one head of one block of
that model, on an image whose patch grid has L cells.
"""
import argparse
import os.path as osp
import sys
from functools import partial


def _ints(text: str) -> tuple:
    try:
        return tuple(int(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected comma-separated ints, got {text!r}')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out-dir', required=True, help='report folder')
    parser.add_argument('--families', nargs='+',
                        help='mixer families (default: all of '
                        'mmdinomamba.studies.expressivity.probe.FAMILIES)')
    parser.add_argument('--grid', nargs=4, action='append',
                        metavar=('TARGETS', 'SEQLENS', 'WIDTHS', 'HEADS'),
                        help='targets x sequence lengths x widths x heads, each a '
                        'comma-separated list; repeatable (default: DEFAULT_GRIDS)')
    parser.add_argument('--budget', nargs='+', type=int, action='append',
                        metavar='N',
                        help='MAX_SEQLEN STEPS RESTARTS [MAX_EVALUATIONS]: evaluations '
                        'of each start, random restarts and the most evaluations '
                        'of a fit up to MAX_SEQLEN tokens; repeatable (default: '
                        'the tiers of mmdinomamba.studies.expressivity.sweep.Budget)')
    parser.add_argument('--inputs', default='random',
                        help='kinds of token input of the --grid grids, '
                        "comma-separated: 'random', 'positional' (default: random)")
    parser.add_argument('--tol', type=float, default=1e-3,
                        help='the convergence rule: the budget doubles until the '
                        'best fit gains less than this (default: 1e-3)')
    parser.add_argument('--feature-dim', type=int, default=128,
                        help='width of the fixed token features')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--memory-limit-gb', type=float, default=8.0,
                        help='refuse fits whose estimated memory is larger')
    parser.add_argument('--show-seqlen', type=int, default=64,
                        help='L of the figure of fitted matrices (0: none)')
    parser.add_argument('--attention-config',
                        help='config of the trained model (trained_attention target)')
    parser.add_argument('--attention-checkpoint',
                        help='its checkpoint (a DINO run, an extracted teacher, ...)')
    parser.add_argument('--attention-layer', type=int, default=-1,
                        help='block index, negative from the end (default: -1)')
    parser.add_argument('--attention-head', type=int, default=0)
    parser.add_argument('--image', help='image file for the trained attention '
                        '(default: a rich toy image)')
    parser.add_argument('--title', default='Expressivity of token mixers')
    parser.add_argument('--device', default='cpu',
                        help='where the fits run: cpu or cuda[:N] (default: cpu)')
    parser.add_argument('--no-progress', action='store_true')
    return parser


def grids_from_args(specs, inputs: str = 'random') -> tuple:
    """Grids from the ``--grid`` quadruples and ``--inputs`` (``DEFAULT_GRIDS``
    without any)."""
    from mmdinomamba.studies.expressivity.sweep import DEFAULT_GRIDS, Grid
    if not specs:
        return DEFAULT_GRIDS
    grids = []
    for targets, seqlens, widths, heads in specs:
        grids.append(Grid(tuple(targets.split(',')), _ints(seqlens), _ints(widths),
                          _ints(heads), tuple(inputs.split(','))))
    return tuple(grids)


def shown_path(path: str) -> str:
    """``path`` relative to the working directory when inside it (reports hold
    no absolute paths of the machine that made them), else its base name."""
    rel = osp.relpath(osp.abspath(path))
    return rel if not rel.startswith('..') else osp.basename(path)


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    # imported after parsing, so that --help answers at once
    from mmdinomamba.studies.expressivity.probe import FAMILIES, check_device
    from mmdinomamba.studies.expressivity.report import write_expressivity_report
    from mmdinomamba.studies.expressivity.sweep import Budget, plan_sweep, run_sweep
    args.families = args.families or list(FAMILIES)
    try:
        check_device(args.device)
        grids = grids_from_args(args.grid, args.inputs)
        budget = Budget(tuple(tuple(t) for t in args.budget)) if args.budget \
            else Budget()
        needs_model = any('trained_attention' in g.targets for g in grids)
        if needs_model and not (args.attention_config and args.attention_checkpoint):
            raise ValueError('the trained_attention target needs --attention-config '
                             'and --attention-checkpoint (or leave it out of --grid)')
        loader = None
        if needs_model:
            from mmdinomamba.studies.expressivity.targets import (
                check_attention_head, trained_attention)
            from mmdinomamba.analysis.loading import load_backbone, load_config
            # the whole sweep is checked before the model is loaded
            plan_sweep(args.families, grids, budget, args.memory_limit_gb,
                       has_trained_attention=True)
            cfg = load_config(args.attention_config)
            backbone = load_backbone(cfg, args.attention_checkpoint)
            check_attention_head(backbone, args.attention_layer, args.attention_head)
            loader = partial(trained_attention, backbone, cfg,
                             layer=args.attention_layer, head=args.attention_head,
                             image=args.image, seed=args.seed)
        results = run_sweep(args.families, grids, budget, args.feature_dim, args.seed,
                            args.memory_limit_gb, loader, args.show_seqlen or None,
                            progress=not args.no_progress, device=args.device,
                            tol=args.tol)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f'expressivity: {err}')
    if needs_model:
        results['meta']['trained_attention'] = dict(
            config=shown_path(args.attention_config),
            checkpoint=shown_path(args.attention_checkpoint),
            layer=args.attention_layer, head=args.attention_head,
            image=shown_path(args.image) if args.image
            else f'rich toy image (seed {args.seed})')
    paths = write_expressivity_report(results, args.out_dir, args.title)
    print('report: ' + ', '.join(sorted(paths.values())))
    return paths


if __name__ == '__main__':
    main()
