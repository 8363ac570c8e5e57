"""Generate the deterministic toy dataset (see ``mmdinomamba.datasets.toy``).

Example::

    python tools/make_toy_data.py data/toy --num-classes 4 --train-per-class 16 \
        --val-per-class 4 --size 96 --seed 0
    python tools/make_toy_data.py data/toy_rich --style rich --num-classes 4 \
        --train-per-class 128 --val-per-class 64 --size 64 --formats imagenet
"""
import argparse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description='Generate the mmdinomamba toy dataset (ImageNet folders with '
        'ImageNet-S masks, ADE20K-style and COCO-style copies).')
    parser.add_argument('out_dir', help='dataset root to create')
    parser.add_argument('--num-classes', type=int, default=4)
    parser.add_argument('--train-per-class', type=int, default=16)
    parser.add_argument('--val-per-class', type=int, default=4)
    parser.add_argument('--size', type=int, default=96, help='image side (px)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--formats', nargs='+', metavar='FORMAT',
                        help="the copies to write, of 'imagenet' (ImageNet folders "
                        "with ImageNet-S masks), 'ade' and 'coco' (default: all)")
    parser.add_argument('--style', default='simple',
                        help="'simple' (default), or 'rich': shape and texture "
                        'classes in random colours on cluttered backgrounds (what '
                        'the toy DINO configs read)')
    parser.add_argument('--placement', default='centred',
                        help="rich style: 'uniform' draws each shape's centre "
                        "anywhere in the image (no centre bias); 'centred' "
                        '(default) keeps shapes inside it')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace a toy dataset made with other arguments')
    return parser


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    # imported after parsing, so that --help answers at once
    from mmdinomamba.datasets.toy import FORMATS, make_toy_dataset
    try:
        make_toy_dataset(args.out_dir, num_classes=args.num_classes,
                         train_per_class=args.train_per_class,
                         val_per_class=args.val_per_class, size=args.size,
                         seed=args.seed, formats=args.formats or list(FORMATS),
                         overwrite=args.overwrite, style=args.style,
                         placement=args.placement)
    except (ValueError, FileExistsError) as err:
        parser.error(str(err))


if __name__ == '__main__':
    main()
