"""Several backbones side by side: k-NN, linear probe, Binary-AUC by layer, ranks.

Writes ``report.md``, ``report.json``, ``auc_vs_depth.png``, ``rank_vs_depth.png``
and ``activation_maps.png`` to ``--out-dir`` (see docs/comparison.md)::

    python tools/analysis/compare_mixers.py --out-dir work_dirs/compare \\
        --data-root data/toy_rich \\
        --model vit configs/compare/vit.py work_dirs/compare/vit_teacher.pth \\
        --model vit-random configs/compare/vit.py random \\
        --probe vit configs/compare/probe_vit.py work_dirs/compare/probe_vit.pth \\
        --pair vit vit-random

Each ``--model NAME CONFIG CHECKPOINT`` is a backbone (``model.backbone`` or
``model`` of CONFIG) with weights from CHECKPOINT, or ``random`` for its seeded
random initialisation. ``--probe NAME PROBE_CONFIG PROBE_CHECKPOINT`` adds the
linear-probe accuracy of model NAME. ``--pair NAME BASE`` adds NAME's gain over
BASE on k-NN and each map's Binary-AUC (last block), with a paired bootstrap
interval (the same images resampled for both). ``--maps`` picks the activation maps that
Binary-AUC scores ('attention': the readout's row of the mixing matrix; 'cosine':
the readout's cosine with every patch; both by default, the first is the headline
one). The data are an ImageNet-style split: an
annotation file of ``<path> <class id>`` lines, an image prefix and, for the
validation split, label maps at the same relative paths under a mask prefix.
"""
import argparse
import sys

from mmengine.config import DictAction


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', nargs=3, action='append', required=True,
                        metavar=('NAME', 'CONFIG', 'CHECKPOINT'),
                        help="a backbone; CHECKPOINT 'random' = random init")
    parser.add_argument('--probe', nargs=3, action='append', default=[],
                        metavar=('NAME', 'PROBE_CONFIG', 'PROBE_CHECKPOINT'),
                        help='the trained linear probe of model NAME')
    parser.add_argument('--pair', nargs=2, action='append', default=[],
                        metavar=('NAME', 'BASE'),
                        help="report NAME's gain over BASE (two --model names) on "
                        'the same images, with a paired bootstrap interval')
    parser.add_argument('--out-dir', required=True, help='report folder')
    parser.add_argument('--data-root', required=True, help='dataset root')
    parser.add_argument('--train-ann', default='meta/train.txt')
    parser.add_argument('--train-prefix', default='train')
    parser.add_argument('--val-ann', default='meta/val.txt')
    parser.add_argument('--val-prefix', default='val')
    parser.add_argument('--mask-prefix', default='masks/val',
                        help='label maps of the validation images')
    parser.add_argument('--img-size', type=int, default=64, help='input side (px)')
    parser.add_argument('--max-train', type=int,
                        help='N training images, evenly spaced over the list')
    parser.add_argument('--max-val', type=int,
                        help='N validation images, evenly spaced over the list '
                        '(a list sorted by class keeps every class)')
    parser.add_argument('--k', type=int, default=20, help='k-NN neighbours')
    parser.add_argument('--temperature', type=float, default=0.07,
                        help='k-NN vote temperature')
    parser.add_argument('--rank-images', type=int, default=2,
                        help='validation images whose mixing matrices are ranked '
                        '(0: none)')
    parser.add_argument('--chunk', type=int, default=16,
                        help='block size c of the off-diagonal ranks')
    parser.add_argument('--num-resamples', type=int, default=1000,
                        help='bootstrap resamples')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--device', default='cpu', help="'cpu' or 'cuda[:i]'")
    parser.add_argument('--maps', nargs='+', default=['attention', 'cosine'],
                        metavar='METHOD',
                        help="activation maps scored by Binary-AUC, of 'attention' "
                        "and 'cosine' (the first is the headline and the figure of "
                        'maps)')
    parser.add_argument('--title', default='Token mixers side by side')
    parser.add_argument('--no-progress', action='store_true')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='overrides merged into every model config, key=value')
    return parser


def specs_from_args(models, probes, cfg_options=None) -> list:
    """ModelSpecs from the ``--model`` and ``--probe`` triples."""
    from mmdinomamba.studies.comparison.measures import ModelSpec
    specs = {}
    for name, config, checkpoint in models:
        if name in specs:
            raise ValueError(f'--model {name!r} is given twice')
        specs[name] = ModelSpec(name, config,
                                None if checkpoint == 'random' else checkpoint,
                                cfg_options=cfg_options)
    for name, config, checkpoint in probes:
        if name not in specs:
            raise ValueError(f'--probe {name!r} names no --model; models: '
                             f'{sorted(specs)}')
        specs[name].probe_config, specs[name].probe_checkpoint = config, checkpoint
    return list(specs.values())


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    # imported after parsing, so that --help answers at once
    from mmdinomamba.analysis.activation_maps import METHODS
    from mmdinomamba.studies.comparison.measures import compare_models, load_split, paired_gains
    from mmdinomamba.studies.comparison.report import display, write_comparison_report
    unknown = [m for m in args.maps if m not in METHODS]
    if unknown:
        parser.error(f'argument --maps: invalid choice: {unknown[0]!r} (choose from '
                     f"{', '.join(map(repr, METHODS))})")
    try:
        specs = specs_from_args(args.model, args.probe, args.cfg_options)
        names = [s.name for s in specs]
        for pair in args.pair:
            for name in pair:
                if name not in names:
                    raise ValueError(f'--pair {" ".join(pair)}: {name!r} names no '
                                     f'--model; models: {sorted(names)}')
        train = load_split(args.data_root, args.train_ann, args.train_prefix,
                           args.img_size, limit=args.max_train)
        val = load_split(args.data_root, args.val_ann, args.val_prefix,
                         args.img_size, args.mask_prefix, limit=args.max_val)
        results = compare_models(
            specs, train, val, k=args.k, temperature=args.temperature,
            rank_images=args.rank_images, chunk=args.chunk,
            num_resamples=args.num_resamples, seed=args.seed,
            batch_size=args.batch_size, device=args.device,
            progress=not args.no_progress, map_methods=args.maps)
        results['pairs'] = paired_gains(results, args.pair, args.num_resamples,
                                        args.seed)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f'compare_mixers: {err}')
    paths = write_comparison_report(results, args.out_dir, display(val.images[:4]),
                                    val.label_maps[:4].numpy(), args.title)
    for m in results['models']:
        aucs = ', '.join(f'{k} {rows[-1]["auc"]["mean"]:.3f}'
                         for k, rows in m['auc_by_method'].items())
        print(f'{m["name"]:>16}: k-NN {100 * m["knn"]["mean"]:.1f} %, Binary-AUC '
              f'(last block) {aucs}')
    print('report: ' + ', '.join(sorted(paths.values())))


if __name__ == '__main__':
    main()
