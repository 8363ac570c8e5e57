"""Figures of the analysis tools: matplotlib without a display, PNGs written atomically.

matplotlib is imported only when a figure is drawn, so the analysis modules import
without it.
"""
from mmdinomamba.utils import write_atomic


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str, dpi: int = 110) -> None:
    """Write ``fig`` to ``path`` as a PNG (atomically: a complete file or none), then
    close it."""
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format='png'))
    pyplot().close(fig)
