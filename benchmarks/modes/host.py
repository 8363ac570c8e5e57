"""The ``host`` mode: the host's work for an eager training step of a DinoVim or
an MLLA through the fused CUDA path, timed and counted on a CPU with the kernels
skipped (:func:`mmdinomamba.ops.skip_kernels`: no GPU host's drift).
"""
from __future__ import annotations

import contextlib
import statistics
from typing import Dict, List, Optional, Sequence

import torch

from mmdinomamba.models.backbones import MLLA, DinoVim
from mmdinomamba.ops import skip_kernels

from ..common import (_HOST_TIMED, _autocast, _first, _fmt, in_rounds, model_table,
                      operators_per_call, python_calls_per_call, set_rope_tables,
                      set_stack_runner, time_ms)
from ..names import DROP_PATH_RATE, LAUNCHES

def measure_host(spec: dict, width: int = 64, batch: int = 2, img_size: int = 64,
                 warmup: int = 3, repeats: int = 7, iters: int = 5,
                 amp: Optional[torch.dtype] = None,
                 launches: Sequence[str] = ('fast', )) -> List[Dict[str, object]]:
    """The host's work for one eager training step (forward, backward) of a DinoVim
    or an MLLA through the fused path, on the CPU with the kernels skipped
    (:func:`mmdinomamba.ops.skip_kernels`).

    The backbone has the spec's depth and layout, a DinoVim at ``width`` channels
    and an MLLA at its own widths, on ``batch`` images of ``img_size`` pixels (18
    tokens at 64 px for a DinoVim, a 16 x 16 grid in an MLLA's first stage), so
    the torch
    operators' arithmetic is negligible and the step is the host's work: the same
    operators, launches and Python as at any size (they depend on the depth and the
    layout, not on the width). With ``amp`` the forward runs under CPU autocast
    in that dtype, as the GPU steps run under CUDA autocast, and the count
    includes the casts of weights and gradients it adds (about 100 operators per
    DinoVim-B step); the time then includes the CPU's own arithmetic in bf16 or
    fp16, which is slow and is not host work on a GPU. None (the default): float32.
    ``launches`` names how the kernels are launched: 'fast' (the package's
    launcher) and/or 'triton' (Triton's own path:
    :func:`benchmarks.triton_launch_internals.tritons_own_launches`).
    With both, the two take turns on one model, a timed run each per repeat (after
    an untimed step on the path switched to), so that a shared machine's slow
    phases meet both alike.

    Returns:
        list[dict]: per launch path, ``launch``, ``host_ms`` (median over
        ``repeats`` runs of ``iters`` steps), its runs ``host_ms_all`` and their
        minimum ``host_ms_min``, and per step ``launches`` (skipped Triton
        launches), ``ops`` (:func:`operators_per_call`) and ``pycalls``.
    """
    cfg = dict(spec)
    kind = cfg.pop('type')
    if kind not in ('DinoVim', 'MLLA'):
        raise ValueError('benchmark host: measures the fused path of DinoVim and MLLA '
                         f"models, got {spec['type']!r}")
    if not launches or not set(launches) <= set(LAUNCHES):
        raise ValueError(f'benchmark host: launches must be some of {LAUNCHES}, '
                         f'got {launches!r}')
    arch = cfg.pop('arch', 'base')
    runner = cfg.pop('stack_runner', None)
    rope_tables = cfg.pop('rope_tables', None)
    cfg.pop('stage_graphs', None)  # CUDA graphs: nothing to replay on the CPU
    cfg.setdefault('drop_path_rate', DROP_PATH_RATE)
    torch.manual_seed(0)
    if kind == 'MLLA':  # its own widths: at 64 px its grids are 16 x 16 down to 2 x 2
        model = MLLA(arch=arch, img_size=img_size, **cfg).train()
        set_rope_tables(model, rope_tables)
    else:
        depth = (DinoVim.arch_zoo[arch.lower()] if isinstance(arch, str) else arch)[
            'num_layers']
        model = DinoVim(arch=dict(embed_dims=width, num_layers=depth),
                        img_size=img_size, **cfg).train()
        set_stack_runner(model, runner)
    x = torch.randn(batch, 3, img_size, img_size)

    def step():
        model.zero_grad(set_to_none=True)
        with _autocast(x.device, amp):
            loss = _first(model(x)).float().square().mean()
        loss.backward()

    def path(launch: str, dry):
        if launch != 'triton':
            return contextlib.nullcontext()
        from ..triton_launch_internals import tritons_own_launches
        return tritons_own_launches(dry)

    runs = {launch: [] for launch in launches}
    rows = []
    with skip_kernels() as dry:
        for launch in launches:
            with path(launch, dry):
                time_ms(step, x.device, warmup, 0, iters)
        for _ in range(repeats):
            for launch in launches:
                with path(launch, dry):
                    if len(launches) > 1:
                        step()  # the first step after a switch
                    runs[launch] += time_ms(step, x.device, 0, 1, iters)
        for launch in launches:
            with path(launch, dry):
                step()  # Triton's path compiles (stands in) at the first step
                before = dry.launches
                step()
                rows.append(dict(launch=launch, host_ms=statistics.median(runs[launch]),
                                 host_ms_all=runs[launch], host_ms_min=min(runs[launch]),
                                 launches=dry.launches - before,
                                 ops=operators_per_call(step),
                                 pycalls=python_calls_per_call(step)))
    return rows


def run_host(specs: Dict[str, dict], baseline: Optional[str] = None, rounds: int = 1,
             launches: Sequence[str] = ('fast', ), **kwargs) -> List[dict]:
    """:func:`measure_host` for each named spec (each under every path of
    ``launches``), the specs taking turns for ``rounds`` rounds, each row keeping its
    lowest median and its lowest run (:func:`best_of_rounds`); ``host_vs_baseline``
    is the baseline's host time (its first launch path's) over the row's (above 1:
    less host work)."""
    rows = in_rounds(lambda: [dict(model=name, **row) for name, spec in specs.items()
                              for row in measure_host(spec, launches=launches, **kwargs)],
                     rounds, _HOST_TIMED, ('host_ms_min', ))
    base = next((r for r in rows if r['model'] == baseline), None)
    if base is not None:
        for r in rows:
            r['host_vs_baseline'] = base['host_ms'] / r['host_ms']
    return rows


def format_host_table(rows: List[dict], baseline: Optional[str]) -> str:
    ratio = f"x{baseline or '-'}"
    head = (f"{'model':<16} {'launch':<7} {'hostMs':>8} {'minMs':>8} {ratio:>14} "
            f"{'launches':>8} {'torchOps':>8} {'pyCalls':>8}")
    lines = [head, '-' * len(head)]
    for r in rows:
        lines.append(f"{r['model']:<16} {r.get('launch', 'fast'):<7} {r['host_ms']:8.2f} "
                     f"{_fmt(r.get('host_ms_min'), '8.2f'):>8} "
                     f"{_fmt(r.get('host_vs_baseline'), '.2f'):>14} {r['launches']:8d} "
                     f"{r['ops']:8d} {r['pycalls']:8d}")
    return '\n'.join(lines)


def run(args, device: torch.device, amp: Optional[torch.dtype], result: dict) -> None:
    """The mode's part of the command line."""
    result['settings'].update(models=args.models, width=args.width, batch=args.batch,
                              rounds=args.rounds, launch=args.launch)
    specs = {name: model_table()[name] for name in args.models}
    baseline = args.baseline if args.baseline in specs else None
    rows = run_host(specs, baseline, args.rounds, args.launch, width=args.width,
                    batch=args.batch, warmup=args.warmup, repeats=args.repeats,
                    iters=args.iters, amp=amp)
    result['rows'] = rows
    print(format_host_table(rows, baseline))
