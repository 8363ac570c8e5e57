"""The expressivity sweep: every family against every target, as L and widths grow.

A sweep is a list of :class:`Grid` s; each grid is the product of its targets,
sequence lengths, widths and heads, and every family of the sweep is fitted on
every cell (:func:`~.expressivity.fit_matrix`). :data:`DEFAULT_GRIDS` is the
sweep of docs/expressivity.md, at width 16 and one head unless said:

- L in {64, 128, 256, 512, 1024} for the permutation, the 2-D band and the
  trained attention;
- L = 64 for the 1-D band, the smooth kernel, the row-stochastic matrix and
  the causal decay;
- widths {8, 32} at L = 128 for the permutation.

It is sized for about 6 minutes of one CPU core; longer sequences are a
``--grid`` away. :class:`Budget` sets the evaluations and
restarts per fit, fewer as L grows (a fit at L = 1024 costs 16 times one at 256). Restart 0 of a fit starts from the
best parameters of the same family, target, width and heads at the previous L
(no parameter depends on L), so that the long sequences, where evaluations are
scarce, start from a fit instead of a random draw; the other restarts, and
every restart on a random target (a new permutation or row-stochastic draw at
each L, where a fit of the last draw is a worse start than a random one), start
from random draws. Every cell is checked (family, target, sizes, the memory it
needs) before the first fit; a line per fit reports the error, the floor and
the time left.
"""
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.logging import print_log

from .expressivity import (FAMILIES, check_device, check_family, check_fit_args,
                           fit_matrix, has_offdiag_block, token_features)
from .expressivity_targets import (TARGETS, build_target, causal_floor, check_target,
                                   offdiag_block, rank_floors)

Tensor = torch.Tensor

__all__ = ['Budget', 'DEFAULT_GRIDS', 'Grid', 'SweepCell', 'plan_sweep', 'run_sweep']


@dataclass(frozen=True)
class Grid:
    """Targets x sequence lengths x widths x heads."""
    targets: Tuple[str, ...]
    seqlens: Tuple[int, ...]
    widths: Tuple[int, ...] = (16, )
    heads: Tuple[int, ...] = (1, )


DEFAULT_GRIDS = (
    Grid(('permutation', 'band_2d', 'trained_attention'), (64, 128, 256, 512, 1024)),
    Grid(('band_1d', 'smooth_kernel', 'row_stochastic', 'causal_decay'), (64, )),
    Grid(('permutation', ), (128, ), (8, 32)),
)


@dataclass(frozen=True)
class Budget:
    """Evaluations (forward and backward passes) and restarts per fit, by L.

    Attributes:
        tiers (tuple): ``(max_seqlen, steps, restarts)`` triples, ``max_seqlen``
            increasing; a fit at L takes the first tier with ``L <= max_seqlen``
            (the last tier beyond). The default spends 200 evaluations on each
            of two restarts at L = 64, then one restart with fewer evaluations
            as a fit's cost grows with L^2: 200, 160, 100 and 60 at 128, 256,
            512 and 1024, warm-started from the same family's fit at the
            shorter L (:func:`run_sweep`).
    """
    tiers: Tuple[Tuple[int, int, int], ...] = ((64, 200, 2), (128, 200, 1),
                                               (256, 160, 1), (512, 100, 1),
                                               (1024, 60, 1))

    def __post_init__(self):
        if not self.tiers:
            raise ValueError('a budget needs at least one (max_seqlen, steps, '
                             'restarts) tier')
        for tier in self.tiers:
            if len(tier) != 3 or not all(isinstance(v, int) and v > 0 for v in tier):
                raise ValueError('each budget tier is (max_seqlen, steps, restarts), '
                                 f'positive ints; got {tier!r}')
        lengths = [t[0] for t in self.tiers]
        if lengths != sorted(set(lengths)):
            raise ValueError(f'budget tiers must have increasing max_seqlen, got '
                             f'{lengths}')

    def at(self, seqlen: int) -> Tuple[int, int]:
        """(steps, restarts) at ``seqlen`` tokens."""
        for max_seqlen, steps, restarts in self.tiers:
            if seqlen <= max_seqlen:
                return steps, restarts
        return self.tiers[-1][1:]


@dataclass(frozen=True)
class SweepCell:
    """One fit of the sweep."""
    family: str
    target: str
    seqlen: int
    width: int
    heads: int


def plan_sweep(families: Sequence[str], grids: Sequence[Grid], budget: Budget,
               memory_limit_gb: float = 8.0,
               has_trained_attention: bool = False) -> List[SweepCell]:
    """The cells of a sweep, every one checked before any work.

    Args:
        families (Sequence[str]): keys of :data:`~.expressivity.FAMILIES`.
        grids (Sequence[Grid]): the grids.
        budget (Budget): evaluations and restarts per fit.
        memory_limit_gb (float): the most memory one fit may need.
        has_trained_attention (bool): whether a trained model is at hand for
            the 'trained_attention' target.

    Returns:
        list[SweepCell]: sorted by L and target.

    Raises:
        ValueError: an unknown family or target, a size that is not a positive
            int (a sequence length must be >= 2), a cell over the memory limit,
            or a trained-attention target without its loader.
    """
    if not families:
        raise ValueError('no mixer families given; choose from '
                         f'{sorted(FAMILIES)}')
    for family in families:
        check_family(family)
    if not grids:
        raise ValueError('no grids given')
    cells, seen = [], set()
    for grid in grids:
        for name in grid.targets:
            if name not in TARGETS:
                raise ValueError(f'unknown target {name!r}; choose one of '
                                 f'{sorted(TARGETS)}')
            if name == 'trained_attention' and not has_trained_attention:
                raise ValueError('the trained_attention target needs a trained '
                                 'model: give its config and checkpoint')
        for seqlen in grid.seqlens:
            if not isinstance(seqlen, int) or seqlen < 2:
                raise ValueError(f'sequence lengths must be ints >= 2, got {seqlen!r}')
        for family in families:
            for name in grid.targets:
                for seqlen in grid.seqlens:
                    for width in grid.widths:
                        for heads in grid.heads:
                            cell = SweepCell(family, name, seqlen, width, heads)
                            if cell in seen:
                                continue
                            steps, restarts = budget.at(seqlen)
                            check_fit_args(family, seqlen, width, heads, steps,
                                           restarts, memory_limit_gb)
                            seen.add(cell)
                            cells.append(cell)
    # by target and length, so that each target is built once and reused
    return sorted(cells, key=lambda c: (c.seqlen, c.target, c.width, c.heads,
                                        list(families).index(c.family)))


# the cost of an evaluation beside its L^2 work (optimiser, Python), in entries
OVERHEAD_ENTRIES = 160 ** 2


def _cost(cell: SweepCell, budget: Budget) -> float:
    """Relative cost of a fit, for the time left: evaluations x (a fixed overhead
    + L^2 entries x heads x matrices)."""
    steps, restarts = budget.at(cell.seqlen)
    fam = FAMILIES[cell.family]
    entries = cell.seqlen ** 2 * fam.matrices(cell.width, cell.heads) * len(fam.keys)
    return steps * restarts * (OVERHEAD_ENTRIES + entries)


def _summary(values: List[Optional[float]]) -> dict:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return dict(best=None, mean=None, std=None, worst=None)
    return dict(best=min(finite), mean=float(np.mean(finite)),
                std=float(np.std(finite)), worst=max(finite))


def _duration(seconds: float) -> str:
    return f'{seconds / 60:.1f} min' if seconds >= 90 else f'{seconds:.0f} s'


def run_sweep(families: Sequence[str], grids: Sequence[Grid] = DEFAULT_GRIDS,
              budget: Budget = Budget(), feature_dim: int = 128, seed: int = 0,
              memory_limit_gb: float = 8.0,
              trained_attention: Optional[Callable[[int], Tensor]] = None,
              show_seqlen: Optional[int] = None, progress: bool = True,
              device='cpu') -> dict:
    """Fit every family on every cell of ``grids``.

    Args:
        families (Sequence[str]): keys of :data:`~.expressivity.FAMILIES`.
        grids (Sequence[Grid]): Defaults to :data:`DEFAULT_GRIDS`.
        budget (Budget): evaluations and restarts per fit.
        feature_dim (int): width of the fixed token features
            (:func:`~.expressivity.token_features`). Defaults to 128.
        seed (int): seed of the features, the random targets and the restarts.
            Defaults to 0.
        memory_limit_gb (float): the most memory one fit may need. Defaults to 8.
        trained_attention (callable, optional): ``seqlen -> T`` for the
            'trained_attention' target (see
            :func:`~.expressivity_targets.trained_attention`).
        show_seqlen (int, optional): keep the fitted matrices (and the targets)
            at this L, for the figure of matrices.
        progress (bool): log one line per fit. Defaults to True.
        device (str | torch.device): where the fits run
            (:func:`~.expressivity.fit_matrix`). Defaults to 'cpu'.

    Returns:
        dict: ``meta``, ``targets`` (one per target and L: floors), ``fits`` (one
        per cell: errors of every restart and their summary, floors, time) and
        ``matrices`` (``{(target, L): {'target': T, family: M}}`` at
        ``show_seqlen``; not JSON).
    """
    cells = plan_sweep(families, grids, budget, memory_limit_gb,
                       trained_attention is not None)
    device = check_device(device)
    start = time.perf_counter()
    total_cost = sum(_cost(c, budget) for c in cells)
    done_cost = 0.0
    targets: Dict[Tuple[str, int], dict] = {}
    cache: Dict[Tuple[str, int], Tensor] = {}
    fits, matrices = [], {}
    features: Dict[int, Tensor] = {}
    # the best parameters of each (family, target, width, heads) at the last L
    warm: Dict[tuple, Dict[str, Tensor]] = {}
    warm_seqlen: Dict[tuple, int] = {}
    for index, cell in enumerate(cells, 1):
        key = (cell.target, cell.seqlen)
        if key not in cache:
            cache.clear()  # one target in memory at a time (cells are sorted)
            T = (trained_attention(cell.seqlen) if cell.target == 'trained_attention'
                 else build_target(cell.target, cell.seqlen, seed))
            check_target(T)
            cache[key] = T.double()
            targets[key] = dict(target=cell.target, seqlen=cell.seqlen,
                                causal_floor=causal_floor(cache[key]), floors={},
                                block_floors={})
        T = cache[key]
        fam = FAMILIES[cell.family]
        info = targets[key]
        floors = dict(whole={}, block={})
        if fam.rank is not None:
            r = fam.rank(cell.width, cell.heads)
            info['floors'].setdefault(r, rank_floors(T, [r])[r])
            floors['whole'][r] = info['floors'][r]
        block = offdiag_block(T)
        if fam.block_rank is not None and has_offdiag_block(T):
            r = fam.block_rank(cell.width, cell.heads)
            info['block_floors'].setdefault(r, rank_floors(block, [r])[r])
            floors['block'][r] = info['block_floors'][r]
        if cell.seqlen not in features:
            features[cell.seqlen] = token_features(cell.seqlen, feature_dim, seed)
        steps, restarts = budget.at(cell.seqlen)
        keep = show_seqlen == cell.seqlen and cell.width == grids[0].widths[0] and \
            cell.heads == grids[0].heads[0]
        line = (cell.family, cell.target, cell.width, cell.heads)
        if TARGETS[cell.target].random:  # a new draw at each L: nothing to carry over
            warm.pop(line, None)
            warm_seqlen.pop(line, None)
        result = fit_matrix(T, cell.family, cell.width, cell.heads, steps=steps,
                            restarts=restarts, seed=seed, memory_limit_gb=memory_limit_gb,
                            keep_matrix=keep, floors=floors,
                            features=features[cell.seqlen], warm_start=warm.get(line),
                            device=device)
        warm_from = warm_seqlen.get(line)
        warm[line], warm_seqlen[line] = result.state, cell.seqlen
        if keep:
            matrices.setdefault(key, {'target': T.float()})[cell.family] = \
                result.matrix.float()
        row = dict(asdict(cell), width_name=fam.width_name, steps=steps,
                   restarts=restarts, warm_start_from=warm_from, errors=result.errors,
                   initial_errors=result.initial_errors,
                   block_errors=result.block_errors, rank=result.rank,
                   floor=result.floor, block_rank=result.block_rank,
                   block_floor=result.block_floor, seconds=result.seconds,
                   error=_summary(result.errors),
                   block_error=_summary(result.block_errors))
        fits.append(row)
        done_cost += _cost(cell, budget)
        if progress:
            elapsed = time.perf_counter() - start
            left = elapsed * (total_cost - done_cost) / done_cost
            floor = '' if result.floor is None else f' (rank floor {result.floor:.3f})'
            print_log(
                f'[{index}/{len(cells)}] {cell.family} {fam.width_name}={cell.width} '
                f'H={cell.heads} | {cell.target} L={cell.seqlen}: error '
                f'{result.best:.4f}{floor} in {result.seconds:.1f} s; '
                f'{_duration(elapsed)} elapsed, about {_duration(left)} left',
                logger='current')
    meta = dict(
        families={name: FAMILIES[name].description for name in families},
        target_descriptions={name: TARGETS[name].description
                             for name in sorted({c.target for c in cells})},
        grids=[asdict(g) for g in grids], budget=asdict(budget),
        feature_dim=feature_dim, seed=seed, torch_threads=torch.get_num_threads(),
        device=str(device),
        torch_version=torch.__version__, wall_seconds=time.perf_counter() - start,
        fits=len(cells), show_seqlen=show_seqlen)
    return dict(meta=meta, targets=[dict(v, floors={str(r): f for r, f in
                                                    v['floors'].items()},
                                         block_floors={str(r): f for r, f in
                                                       v['block_floors'].items()})
                                    for v in targets.values()],
                fits=fits, matrices=matrices)
