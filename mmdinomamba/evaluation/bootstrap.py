"""Bootstrap confidence intervals over images (percentile method).

Given one value per image (a 0/1 k-NN hit, an image's Binary-AUC), draw B resamples
of the n images with replacement, take the mean of each, and report the
``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the B means (Efron and
Tibshirani, "An Introduction to the Bootstrap", 1993, chapter 13). Resample b uses
row b of ``numpy.random.default_rng(seed).integers(0, n, size=(B, n))``, so an
interval depends only on the values, B, the level and the seed.

Images whose value is nan (e.g. a Binary-AUC of an image without background) are
dropped first, as the mean over images drops them.
"""
from typing import NamedTuple, Sequence, Union

import numpy as np
import torch

__all__ = ['BootstrapCI', 'bootstrap_ci', 'bootstrap_means']


class BootstrapCI(NamedTuple):
    """A mean over images with its percentile bootstrap interval.

    Attributes:
        mean (float): the mean over the (non-nan) images.
        low (float): lower end of the interval.
        high (float): upper end of the interval.
        num (int): images used.
    """
    mean: float
    low: float
    high: float
    num: int

    def as_dict(self) -> dict:
        return dict(mean=self.mean, low=self.low, high=self.high, num=self.num)


def _values(values: Union[Sequence[float], np.ndarray, torch.Tensor]) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f'values must be one number per image (1-d), got shape '
                         f'{array.shape}')
    return array[~np.isnan(array)]


def bootstrap_means(values: Union[Sequence[float], np.ndarray, torch.Tensor],
                    num_resamples: int = 1000, seed: int = 0) -> np.ndarray:
    """The means of ``num_resamples`` bootstrap resamples of the per-image values.

    Args:
        values (array-like): (num_images,) one value per image; nan = dropped.
        num_resamples (int): B. Defaults to 1000.
        seed (int): seed of the resampling. Defaults to 0.

    Returns:
        np.ndarray: (num_resamples,) float64.
    """
    array = _values(values)
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or \
            num_resamples < 1:
        raise ValueError(f'num_resamples must be a positive int, got {num_resamples!r}')
    if array.size == 0:
        raise ValueError('bootstrap over no images (every value is nan or none given)')
    idx = np.random.default_rng(seed).integers(0, array.size,
                                               size=(num_resamples, array.size))
    return array[idx].mean(axis=1)


def bootstrap_ci(values: Union[Sequence[float], np.ndarray, torch.Tensor],
                 level: float = 0.95,
                 num_resamples: int = 1000,
                 seed: int = 0) -> BootstrapCI:
    """Mean over images and its percentile bootstrap interval.

    Args:
        values (array-like): (num_images,) one value per image; nan = dropped.
        level (float): coverage in (0, 1). Defaults to 0.95.
        num_resamples (int): B. Defaults to 1000.
        seed (int): seed of the resampling. Defaults to 0.

    Returns:
        BootstrapCI: mean, low, high, num.
    """
    if not 0 < level < 1:
        raise ValueError(f'level must be in (0, 1), got {level!r}')
    array = _values(values)
    means = bootstrap_means(array, num_resamples, seed)
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return BootstrapCI(float(array.mean()), float(low), float(high), int(array.size))
