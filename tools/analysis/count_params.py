"""Print parameter counts of the paper's backbones next to the paper's figures.

    python tools/analysis/count_params.py
"""
from mmdinomamba.analysis.params import count_backbone_params


def main():
    print(f"{'backbone':<20}{'params (M)':>12}{'paper (M)':>11}{'diff':>8}")
    for name, params, paper in count_backbone_params():
        millions = params / 1e6
        paper_col = f'{paper:.1f}' if paper else '-'
        diff = f'{100 * (millions / paper - 1):+.1f}%' if paper else '-'
        print(f'{name:<20}{millions:>12.2f}{paper_col:>11}{diff:>8}')


if __name__ == '__main__':
    main()
