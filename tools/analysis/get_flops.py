"""Parameters and multiply-accumulates (conv + matmul) of a config's model.

    python tools/analysis/get_flops.py configs/mlla/mlla-tiny_32xb128-300e_in1k.py
    python tools/analysis/get_flops.py CONFIG --shape 512 512

The model is built as the config says (no weights loaded) and run once on a
random (1, 3, H, W) input on the CPU; what ran is printed (a detector's
backbone and neck, a classifier's or segmentor's whole tensor forward). MACs
are counted as executed, einsums (the SSD scan, linear attention) included;
elementwise work is not counted. See mmdinomamba/analysis/flops.py and
docs/mlla.md.
"""
import argparse

from mmengine.config import DictAction


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Count the parameters and MACs (conv + matmul) of a model')
    parser.add_argument('config', help='config file')
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224],
                        metavar=('H', 'W'), help='input size (default: 224 224)')
    parser.add_argument('--in-channels', type=int, default=3,
                        help='input channels (default: 3)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # imported after parsing, so that --help answers at once
    from mmdinomamba.analysis.flops import (build_model_from_config, describe,
                                            model_complexity)
    from mmdinomamba.analysis.loading import load_config
    cfg = load_config(args.config, args.cfg_options)
    model = build_model_from_config(cfg)
    result = model_complexity(model, args.shape, args.in_channels)
    print(describe(result, f'config: {args.config}'))
    return result


if __name__ == '__main__':
    main()
