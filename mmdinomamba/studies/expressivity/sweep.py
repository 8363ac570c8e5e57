"""The expressivity sweep: every family against every target, as L and widths grow.

A sweep is a list of :class:`Grid` s; each grid is the product of its targets,
sequence lengths, widths, heads and kinds of input, and every family of the
sweep is fitted on every cell (:func:`~.probe.fit_matrix`: a
constructive start where the family has one, restarts, and the convergence
rule). :data:`DEFAULT_GRIDS` is the sweep of docs/expressivity.md, at width 16
and one head unless said:

- L in {64, 128, 256} for the permutation and the 2-D band, and at L = 256 the
  same with positional inputs (for L <= feature_dim the random features have
  full row rank, so both kinds of input give the same family: they differ only
  beyond);
- L = 64 for the 1-D band, the smooth kernel, the row-stochastic matrix and
  the causal decay;
- widths {8, 32} at L = 128 for the permutation.

Each cell reports ``[lower bound, best fit]``: the largest certified floor of
the family (:func:`~.probe.family_floors`) and the best error found.
Containment is enforced: a family's cell is never reported worse than a cell it
contains (:data:`~.probe.CONTAINS`: a smaller width or fewer heads,
the causal SSD inside the bidirectional one, MLLA inside MLLA with LePE) on the
same target, L and inputs; a cell that takes the contained cell's fit says so
(``inherited_from``); where the parameters nest (the SSDs: a smaller N, the
causal SSD in the bidirectional one), the fit also starts from the contained
cell's best fit (:func:`~.probe.nested_state`, start 'contained'). A
fit above 1 (worse than the zero matrix) is "no fit".
:class:`Budget` sets the base evaluations and random restarts per fit by L;
restarts also start from the best parameters of the same family, target,
width, heads and inputs at the previous L (no parameter depends on L), except
on random targets (a new draw at each L). Every cell is checked (family,
target, sizes, inputs, the memory it needs) before the first fit; a line per
fit reports the interval and the time left.
"""
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.logging import print_log

from .probe import (FAMILIES, INPUTS, check_device, check_family,
                    check_fit_args, contained_cells, family_floors, fit_matrix,
                    has_offdiag_block, nested_state, nests, token_features)
from .targets import (TARGETS, build_target, causal_floor, check_target,
                      offdiag_block, rank_floors)

Tensor = torch.Tensor

__all__ = ['Budget', 'DEFAULT_GRIDS', 'Grid', 'SweepCell', 'plan_sweep', 'run_sweep']


@dataclass(frozen=True)
class Grid:
    """Targets x sequence lengths x widths x heads x inputs
    (:data:`~.probe.INPUTS`)."""
    targets: Tuple[str, ...]
    seqlens: Tuple[int, ...]
    widths: Tuple[int, ...] = (16, )
    heads: Tuple[int, ...] = (1, )
    inputs: Tuple[str, ...] = ('random', )


DEFAULT_GRIDS = (
    Grid(('permutation', 'band_2d'), (64, 128, 256)),
    Grid(('permutation', 'band_2d'), (256, ), inputs=('positional', )),
    Grid(('band_1d', 'smooth_kernel', 'row_stochastic', 'causal_decay'), (64, )),
    Grid(('permutation', ), (128, ), (8, 32)),
)


@dataclass(frozen=True)
class Budget:
    """Evaluations (forward and backward passes) and restarts per fit, by L.

    Attributes:
        tiers (tuple): ``(max_seqlen, steps, restarts, max_evaluations)``
            tuples (the last may be left out: 16 x steps per start),
            ``max_seqlen`` increasing; a fit at L takes the first tier with
            ``L <= max_seqlen`` (the last tier beyond). ``steps`` is each
            start's budget, and the first convergence round's half;
            ``restarts`` the random starts beside the constructive and warm
            ones; ``max_evaluations`` the most a fit may spend, its starts and
            rounds together (a fit that stops there is reported as not
            converged). The default: 200 evaluations a start, one random
            restart and at most 4800 at L = 64; 100, one and 3200 at 128; 80,
            one and 1280 at 256.
    """
    tiers: Tuple[Tuple[int, ...], ...] = ((64, 200, 1, 4800), (128, 100, 1, 3200),
                                          (256, 80, 1, 1280))

    def __post_init__(self):
        if not self.tiers:
            raise ValueError('a budget needs at least one (max_seqlen, steps, '
                             'restarts[, max_evaluations]) tier')
        for tier in self.tiers:
            if len(tier) not in (3, 4) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0
                    for v in tier):
                raise ValueError('each budget tier is (max_seqlen, steps, restarts'
                                 f'[, max_evaluations]), positive ints; got {tier!r}')
        lengths = [t[0] for t in self.tiers]
        if lengths != sorted(set(lengths)):
            raise ValueError(f'budget tiers must have increasing max_seqlen, got '
                             f'{lengths}')

    def _tier(self, seqlen: int) -> Tuple[int, ...]:
        for tier in self.tiers:
            if seqlen <= tier[0]:
                return tier
        return self.tiers[-1]

    def cap(self, seqlen: int) -> Optional[int]:
        """The most evaluations of a fit at ``seqlen`` tokens (None: the fit's
        own default)."""
        tier = self._tier(seqlen)
        return tier[3] if len(tier) == 4 else None

    def at(self, seqlen: int) -> Tuple[int, int]:
        """(steps, restarts) at ``seqlen`` tokens."""
        return tuple(self._tier(seqlen)[1:3])


@dataclass(frozen=True)
class SweepCell:
    """One fit of the sweep."""
    family: str
    target: str
    seqlen: int
    width: int
    heads: int
    inputs: str = 'random'


def plan_sweep(families: Sequence[str], grids: Sequence[Grid], budget: Budget,
               memory_limit_gb: float = 8.0,
               has_trained_attention: bool = False) -> List[SweepCell]:
    """The cells of a sweep, every one checked before any work.

    Args:
        families (Sequence[str]): keys of :data:`~.probe.FAMILIES`.
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
        for inputs in grid.inputs:
            if inputs not in INPUTS:
                raise ValueError(f'unknown inputs {inputs!r}; choose from '
                                 f'{list(INPUTS)}')
        for family in families:
            for name in grid.targets:
                for seqlen in grid.seqlens:
                    for width in grid.widths:
                        for heads in grid.heads:
                            for inputs in grid.inputs:
                                cell = SweepCell(family, name, seqlen, width, heads,
                                                 inputs)
                                if cell in seen:
                                    continue
                                steps, restarts = budget.at(seqlen)
                                check_fit_args(family, seqlen, width, heads, steps,
                                               restarts, memory_limit_gb)
                                seen.add(cell)
                                cells.append(cell)
    # by target and length, so that each target is built once and reused; a
    # contained family (smaller width, fewer heads, earlier in FAMILIES) first
    order = list(FAMILIES)
    return sorted(cells, key=lambda c: (c.seqlen, c.target, c.inputs, c.width, c.heads,
                                        order.index(c.family)))


# the cost of an evaluation beside its L^2 work (optimiser, Python), in entries
OVERHEAD_ENTRIES = 160 ** 2


def _cost(cell: SweepCell, budget: Budget) -> float:
    """Relative cost of a fit, for the time left: its most evaluations x (a
    fixed overhead + L^2 entries x heads x matrices)."""
    steps, restarts = budget.at(cell.seqlen)
    evaluations = budget.cap(cell.seqlen) or 16 * steps * (restarts + 2)
    fam = FAMILIES[cell.family]
    entries = cell.seqlen ** 2 * fam.matrices(cell.width, cell.heads) * len(fam.keys)
    return evaluations * (OVERHEAD_ENTRIES + entries)


def _duration(seconds: float) -> str:
    return f'{seconds / 60:.1f} min' if seconds >= 90 else f'{seconds:.0f} s'


def _interval(row: dict) -> str:
    best = 'no fit' if row['best'] is None else f"{row['best']:.4f}"
    return f"[{row['lower_bound']:.4f}, {best}]"


def run_sweep(families: Sequence[str], grids: Sequence[Grid] = DEFAULT_GRIDS,
              budget: Budget = Budget(), feature_dim: int = 128, seed: int = 0,
              memory_limit_gb: float = 8.0,
              trained_attention: Optional[Callable[[int], Tensor]] = None,
              show_seqlen: Optional[int] = None, progress: bool = True,
              device='cpu', tol: float = 1e-3) -> dict:
    """Fit every family on every cell of ``grids``.

    Args:
        families (Sequence[str]): keys of :data:`~.probe.FAMILIES`.
        grids (Sequence[Grid]): Defaults to :data:`DEFAULT_GRIDS`.
        budget (Budget): evaluations and restarts per fit.
        feature_dim (int): width of the fixed token features
            (:func:`~.probe.token_features`). Defaults to 128.
        seed (int): seed of the features, the random targets and the restarts.
            Defaults to 0.
        memory_limit_gb (float): the most memory one fit may need. Defaults to 8.
        trained_attention (callable, optional): ``seqlen -> T`` for the
            'trained_attention' target (see
            :func:`~.targets.trained_attention`).
        show_seqlen (int, optional): keep the fitted matrices (and the targets)
            at this L (first grid's width, heads and inputs), for the figure of
            matrices.
        progress (bool): log one line per fit. Defaults to True.
        device (str | torch.device): where the fits run
            (:func:`~.probe.fit_matrix`). Defaults to 'cpu'.
        tol (float): the convergence rule's least gain. Defaults to 1e-3.

    Returns:
        dict: ``meta``, ``targets`` (one per target and L: rank and causal
        floors), ``fits`` (one per cell: ``lower_bound`` and its ``floors``,
        ``best`` (None for no fit), each start's error, the convergence rounds,
        ``evaluations``, ``converged``, ``inherited_from``) and ``matrices``
        (``{(target, L): {'target': T, family: M}}`` at ``show_seqlen``; not
        JSON).
    """
    cells = plan_sweep(families, grids, budget, memory_limit_gb,
                       trained_attention is not None)
    device = check_device(device)
    start = time.perf_counter()
    total_cost = sum(_cost(c, budget) for c in cells)
    done_cost = 0.0
    targets: Dict[Tuple[str, int], dict] = {}
    cache: Dict[Tuple[str, int], Tensor] = {}
    bounds: Dict[tuple, Dict[str, float]] = {}
    fits, matrices = [], {}
    features: Dict[Tuple[int, str], Tensor] = {}
    # the best parameters of each (family, target, width, heads, inputs) at the last L
    warm: Dict[tuple, Dict[str, Tensor]] = {}
    warm_seqlen: Dict[tuple, int] = {}
    # (target, L, inputs) -> {(family, width, heads): (best, matrix)}
    done: Dict[tuple, Dict[tuple, tuple]] = {}
    # (target, L, inputs) -> {(family, width, heads): (own best fit, its parameters)}
    states: Dict[tuple, Dict[tuple, tuple]] = {}
    base = grids[0]
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
        bound_key = (cell.target, cell.seqlen, cell.family, cell.width, cell.heads)
        if bound_key not in bounds:
            bounds[bound_key] = family_floors(cell.family, T, cell.width, cell.heads)
        fkey = (cell.seqlen, cell.inputs)
        if fkey not in features:
            features[fkey] = token_features(cell.seqlen, feature_dim, seed, cell.inputs)
        steps, restarts = budget.at(cell.seqlen)
        keep = show_seqlen == cell.seqlen and cell.width == base.widths[0] and \
            cell.heads == base.heads[0] and cell.inputs == base.inputs[0]
        line = (cell.family, cell.target, cell.width, cell.heads, cell.inputs)
        if TARGETS[cell.target].random:  # a new draw at each L: nothing to carry over
            warm.pop(line, None)
            warm_seqlen.pop(line, None)
        # a start from the best fit of a contained family whose parameters nest
        group_states = states.setdefault((cell.target, cell.seqlen, cell.inputs), {})
        nested = [(error, inner) for inner, (error, _) in group_states.items()
                  if nests(cell.family, cell.width, cell.heads, inner)]
        contained = None
        if nested:
            inner = min(nested)[1]
            contained = nested_state(cell.family, cell.width, inner,
                                     group_states[inner][1], features[fkey])
        result = fit_matrix(T, cell.family, cell.width, cell.heads, steps=steps,
                            restarts=restarts, seed=seed, memory_limit_gb=memory_limit_gb,
                            keep_matrix=keep, floors=floors, contained_start=contained,
                            features=features[fkey], warm_start=warm.get(line),
                            device=device, tol=tol, bounds=bounds[bound_key],
                            max_steps=budget.cap(cell.seqlen))
        warm_from = warm_seqlen.get(line)
        if result.state is not None:
            warm[line], warm_seqlen[line] = result.state, cell.seqlen
            group_states[(cell.family, cell.width, cell.heads)] = (result.best,
                                                                   result.state)
        # containment: never worse than a contained family's cell
        group = done.setdefault((cell.target, cell.seqlen, cell.inputs), {})
        reported, matrix, inherited = result.reported, result.matrix, None
        best_block = result.best_block
        for other in contained_cells(cell.family, cell.width, cell.heads, list(group)):
            value, other_matrix, other_block = group[other]
            if value is not None and (reported is None or value < reported):
                reported, best_block = value, other_block
                matrix = other_matrix if other_matrix is not None else matrix
                inherited = dict(family=other[0], width=other[1], heads=other[2])
        group[(cell.family, cell.width, cell.heads)] = (reported, matrix, best_block)
        if keep and matrix is not None:
            matrices.setdefault(key, {'target': T.float()})[cell.family] = matrix.float()
        lower = max(bounds[bound_key].values())
        row = dict(asdict(cell), width_name=fam.width_name, steps=steps,
                   restarts=restarts, warm_start_from=warm_from,
                   starts=result.starts, errors=result.errors,
                   initial_errors=result.initial_errors, fit_best=result.best
                   if math.isfinite(result.best) else None,
                   best_start=result.best_start, rounds=result.rounds,
                   evaluations=result.evaluations, converged=result.converged,
                   best=reported, inherited_from=inherited, lower_bound=lower,
                   floors=bounds[bound_key], best_block=best_block,
                   rank=result.rank, floor=result.floor,
                   block_rank=result.block_rank, block_floor=result.block_floor,
                   seconds=result.seconds)
        fits.append(row)
        done_cost += _cost(cell, budget)
        if progress:
            elapsed = time.perf_counter() - start
            left = elapsed * (total_cost - done_cost) / done_cost
            print_log(
                f'[{index}/{len(cells)}] {cell.family} {fam.width_name}={cell.width} '
                f'H={cell.heads} | {cell.target} L={cell.seqlen} {cell.inputs}: '
                f'{_interval(row)} after {result.evaluations} evaluations'
                f'{"" if result.converged else " (not converged)"}'
                f'{" (contained fit)" if inherited else ""} in {result.seconds:.1f} s; '
                f'{_duration(elapsed)} elapsed, about {_duration(left)} left',
                logger='current')
    meta = dict(
        families={name: FAMILIES[name].description for name in families},
        target_descriptions={name: TARGETS[name].description
                             for name in sorted({c.target for c in cells})},
        grids=[asdict(g) for g in grids], budget=asdict(budget),
        feature_dim=feature_dim, seed=seed, tol=tol,
        torch_threads=torch.get_num_threads(), device=str(device),
        torch_version=torch.__version__, wall_seconds=time.perf_counter() - start,
        fits=len(cells), show_seqlen=show_seqlen)
    return dict(meta=meta, targets=[dict(v, floors={str(r): f for r, f in
                                                    v['floors'].items()},
                                         block_floors={str(r): f for r, f in
                                                       v['block_floors'].items()})
                                    for v in targets.values()],
                fits=fits, matrices=matrices)
