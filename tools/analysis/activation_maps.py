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

import torch
from mmengine.config import DictAction
from mmengine.logging import print_log
from mmengine.registry import DATASETS

from mmdinomamba.analysis.activation_map_report import (display_images, label_map,
                                                        layer_auc, map_aucs,
                                                        plot_layer_auc,
                                                        plot_map_grid,
                                                        preprocess_samples)
from mmdinomamba.analysis.activation_maps import activation_maps
from mmdinomamba.analysis.loading import load_backbone, load_config
from mmdinomamba.analysis.mixing import normalise_layers, num_layers
from mmdinomamba.engine import dump_atomic


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
    evaluator_cfg = cfg.get('test_evaluator')

    name = type(model.backbone).__name__
    weights = osp.basename(args.checkpoint) if args.checkpoint else 'random init'
    inputs, samples = preprocess_samples(model, dataset, args.images)
    maps = activation_maps(model.backbone, inputs, model.layer, model.method,
                           model.num_heads, model.feature_source)
    labels = [label_map(s) for s in samples]
    aucs = map_aucs(maps, labels, evaluator_cfg)
    depth = num_layers(model.backbone)
    block = normalise_layers([model.layer], depth)[0] + 1
    grid_path = osp.join(args.out_dir, 'activation_maps.png')
    plot_map_grid(display_images(model, inputs), labels, maps, aucs, grid_path,
                  f'{name} ({weights}), block {block} of {depth}, {model.method} '
                  'maps', evaluator_cfg, dpi=args.dpi)

    indices = list(range(min(args.curve_images, len(dataset))))
    rows = layer_auc(model, dataset, indices, evaluator_cfg, args.layers,
                     args.batch_size)
    curve_path = osp.join(args.out_dir, 'layer_auc.png')
    plot_layer_auc(rows, curve_path, f'{name} ({weights}), {len(indices)} images, '
                   f'{model.method} maps')
    json_path = osp.join(args.out_dir, 'layer_auc.json')
    dump_atomic(dict(config=args.config, checkpoint=args.checkpoint,
                     method=model.method, num_images=len(indices), layers=rows,
                     grid=dict(images=args.images, layer=model.layer,
                               aucs=aucs.tolist())), json_path)
    print('block  binary_auc  mean_map_auc  skipped')
    for row in rows:
        print(f"{row['layer'] + 1:5d}  {row['binary_auc']:10.4f}  "
              f"{row['mean_map_auc']:12.4f}  {row['num_skipped']:7d}")
    print_log(f'wrote {grid_path}, {curve_path}, {json_path}', logger='current')
    return dict(grid=grid_path, curve=curve_path, json=json_path)


if __name__ == '__main__':
    main()
