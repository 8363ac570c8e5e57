"""Rank analysis of the token-mixing matrices M (Y = M X) of a backbone.

Writes ``mixer_rank.json``, ``mixer_rank.csv`` (per layer and matrix),
``mixer_rank_heads.csv`` (per image, layer, matrix and head), ``mixer_rank.md``
and the plots ``spectra.png`` and ``rank_vs_layer.png`` to ``--out-dir``, and
prints the table. See docs/rank_analysis.md.

    python tools/analysis/mixer_rank.py configs/analysis/dinovim-mini_p16_128px.py \\
        --toy --num-images 4 --chunk 32 --out-dir work_dirs/rank/dinovim-mini

CONFIG is any config whose ``model`` is a backbone or has a ``model.backbone``
(DinoVim, LinearViT, mmpretrain VisionTransformer). Without CHECKPOINT the
backbone is randomly initialised.
"""
import argparse

from mmengine.config import DictAction


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Materialise and measure the token-mixing matrices of a backbone')
    parser.add_argument('config', help='config file (model or model.backbone)')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint file (optional)')
    parser.add_argument('--out-dir', required=True, help='folder for tables and plots')
    parser.add_argument('--layers', type=int, nargs='+',
                        help='block indices, negative from the end (default: all)')
    parser.add_argument('--chunk', type=int, default=64,
                        help='block size c for the block ranks (default: 64)')
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--images', help='folder of images (searched recursively)')
    source.add_argument('--toy', action='store_true',
                        help='use images of the toy generator')
    parser.add_argument('--num-images', type=int, default=8,
                        help='images to analyse (default: 8)')
    parser.add_argument('--img-size', type=int,
                        help='input side of the default pipeline, used when the '
                        'config has no test pipeline (default: the backbone\'s '
                        'img_size or 224)')
    parser.add_argument('--seed', type=int, default=0,
                        help='seed of the toy images and of the random init')
    parser.add_argument('--rtol', type=float,
                        help='relative rank tolerance (default: max(m, n) * eps)')
    parser.add_argument('--atol', type=float, default=0.0,
                        help='absolute rank tolerance (default: 0)')
    parser.add_argument('--prefix',
                        help='checkpoint key prefix of the backbone, e.g. '
                        '"backbone." (default: found)')
    parser.add_argument('--no-strict', action='store_true',
                        help='load a checkpoint that does not cover the backbone '
                        '(missing keys keep their random init; default: fail)')
    parser.add_argument('--device', help='default: cuda when available, else cpu')
    parser.add_argument('--no-progress', action='store_true',
                        help='no progress bar')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.num_images < 1:
        raise ValueError(f'--num-images must be >= 1, got {args.num_images}')
    # imported after parsing, so that --help answers at once
    import torch
    from mmengine.logging import print_log

    from mmdinomamba.analysis.images import ImagePipeline, folder_images, toy_images
    from mmdinomamba.analysis.loading import backbone_config, load_backbone, load_config
    from mmdinomamba.analysis.mixing_rank import analyse_backbone
    from mmdinomamba.analysis.rank_report import format_table, write_report
    cfg = load_config(args.config, args.cfg_options)
    backbone_cfg = backbone_config(cfg)
    torch.manual_seed(args.seed)
    backbone = load_backbone(cfg, args.checkpoint, args.prefix,
                             strict=not args.no_strict)
    size = args.img_size or backbone_cfg.get('img_size', 224)
    size = size[0] if isinstance(size, (list, tuple)) else size
    pipeline = ImagePipeline(cfg, size)
    images = (folder_images(pipeline, args.images, args.num_images) if args.images
              else toy_images(pipeline, args.num_images, size, args.seed))
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    report = analyse_backbone(backbone, images, args.layers, args.chunk, args.rtol,
                              args.atol, device=device,
                              progress=not args.no_progress)
    report.meta.update(config=args.config, checkpoint=args.checkpoint,
                       backbone=backbone_cfg['type'],
                       images=args.images or f'toy (seed {args.seed})')
    weights = 'checkpoint' if args.checkpoint else 'random init'
    paths = write_report(report, args.out_dir, f"{backbone_cfg['type']}, {weights}")
    print(format_table(report.summary))
    print_log('wrote ' + ', '.join(paths.values()), logger='current')
    return paths


if __name__ == '__main__':
    main()
