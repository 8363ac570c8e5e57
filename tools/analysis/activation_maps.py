"""Activation maps of a backbone on labelled images: a PNG grid and per-layer AUC.

Writes to ``--out-dir``:

- ``activation_maps.png``: one row per image of ``--images``: the image, its
  foreground mask, the map of every head and the mean map, each with its
  Binary-AUC (at the model's layer, default the last);
- ``layer_auc.png``: Binary-AUC against block index over ``--curve-images``
  images (mean over heads, head-mean map, range over heads);
- ``layer_auc.json``: the numbers of the curve;

and prints the per-layer table. See docs/binary_auc.md.

    python tools/analysis/activation_maps.py \\
        configs/binary_auc/binary-auc_dinovim-toy-p8_toy.py CHECKPOINT \\
        --images 0 1 2 3 --out-dir work_dirs/activation_maps/toy

CONFIG is a ``configs/binary_auc/`` config: ``model`` an ActivationMapModel, and
``test_dataloader.dataset`` a dataset with label maps. Without CHECKPOINT the
model is randomly initialised.
"""
import argparse
import os.path as osp

from mmengine.config import DictAction


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Activation-map grid and per-layer Binary-AUC of a backbone')
    parser.add_argument('config', help='a configs/binary_auc/ config')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint file (optional)')
    parser.add_argument('--out-dir', required=True, help='folder for the PNGs/JSON')
    parser.add_argument('--images', type=int, nargs='+', default=[0, 1, 2, 3],
                        help='dataset indices of the grid rows (default: 0 1 2 3)')
    parser.add_argument('--curve-images', type=int, default=16,
                        help='first N dataset images scored for the per-layer '
                        'curve (default: 16)')
    parser.add_argument('--layers', type=int, nargs='+',
                        help='blocks of the curve, negative from the end '
                        '(default: all)')
    parser.add_argument('--batch-size', type=int, default=8,
                        help='images per forward pass (default: 8)')
    parser.add_argument('--dpi', type=int, default=100,
                        help='resolution of the grid PNG (default: 100)')
    parser.add_argument('--no-strict', action='store_true',
                        help='load a checkpoint that does not cover the backbone '
                        '(missing keys keep their random init; default: fail)')
    parser.add_argument('--device', help='default: cuda when available, else cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    for name in ('curve_images', 'batch_size', 'dpi'):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got "
                             f'{getattr(args, name)}')
    if args.checkpoint and not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    # imported after parsing, so that --help answers at once
    import torch
    from mmengine.logging import print_log
    from mmengine.registry import DATASETS

    from mmdinomamba.analysis.activation_map_report import format_layer_auc, write_report
    from mmdinomamba.analysis.loading import load_backbone, load_config
    cfg = load_config(args.config, args.cfg_options)
    if cfg.model.get('type') != 'ActivationMapModel':
        raise ValueError(f"{args.config}: model.type must be 'ActivationMapModel' "
                         '(a configs/binary_auc/ config), got '
                         f"{cfg.model.get('type')!r}")
    model = load_backbone(cfg, args.checkpoint, strict=not args.no_strict,
                          part='model')
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    model.to(device).eval()
    dataset = DATASETS.build(cfg.test_dataloader.dataset)
    paths, rows = write_report(
        model, dataset, args.out_dir, args.images, args.curve_images, args.layers,
        args.batch_size, cfg.get('test_evaluator'), args.dpi,
        osp.basename(args.checkpoint) if args.checkpoint else 'random init',
        dict(config=args.config, checkpoint=args.checkpoint))
    print(format_layer_auc(rows))
    print_log('wrote ' + ', '.join(paths.values()), logger='current')
    return paths


if __name__ == '__main__':
    main()
