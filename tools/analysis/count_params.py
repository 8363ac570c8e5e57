"""Print the parameter counts of the backbones next to the paper's figures.

    python tools/analysis/count_params.py

The paper's backbones, by their names in :data:`mmdinomamba.zoo.BACKBONES`,
built on the meta device (no memory, no weights).
"""
import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Parameter counts of the backbones next to the paper's figures")
    return parser.parse_args(argv)


def main(argv=None):
    parse_args(argv)
    from mmdinomamba.analysis.params import count_backbone_params
    print(f"{'backbone':<20}{'params (M)':>12}{'paper (M)':>11}{'diff':>8}")
    for name, params, paper in count_backbone_params():
        millions = params / 1e6
        paper_col = f'{paper:.1f}' if paper else '-'
        diff = f'{100 * (millions / paper - 1):+.1f}%' if paper else '-'
        print(f'{name:<20}{millions:>12.2f}{paper_col:>11}{diff:>8}')


if __name__ == '__main__':
    main()
