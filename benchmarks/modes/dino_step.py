"""The ``dino-step`` mode: the paper's DINO training step built from a shipped
config through the registry (student on every crop, teacher on the global ones,
the DINO head and loss, per-parameter clipping, AdamW, the teacher EMA), as
``Runner.train_step`` runs it.
"""
from __future__ import annotations

import os.path as osp
import statistics
import traceback
from typing import Dict, List, Optional

import torch

from mmdinomamba.engine import graphed_blocks
from mmdinomamba.engine.hooks.compile_hook import compile_submodules

from ..common import (_DINO_TIMED, _fmt, _peak_gib, _peak_reserved_gib, _reset_peak,
                      in_rounds, launches_per_call, operators_per_call,
                      python_calls_per_call, synchronize, time_ms)
from ..names import DINO_BASELINE, DINO_CONFIGS

def dino_views(cfg, batch: int, device: torch.device) -> dict:
    """A batch as the DINO pipeline of ``cfg`` delivers it (uint8, on the host,
    pinned on CUDA): ``dict(inputs=[view, ...], data_samples=[...])``, every view
    (batch, 3, size, size) with the config's global and local crop sizes."""
    from mmpretrain.structures import DataSample
    crop = next(t for t in cfg.train_dataloader.dataset.pipeline
                if t['type'] in ('DINOMultiCrop', 'mmdinomamba.DINOMultiCrop'))
    sizes = ([crop.get('global_size', 224)] * crop.get('num_global_views', 2)
             + [crop.get('local_size', 96)] * crop.get('num_local_views', 8))
    gen = torch.Generator().manual_seed(0)
    views = []
    for size in sizes:
        v = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8,
                          generator=gen)
        views.append(v.pin_memory() if device.type == 'cuda' else v)
    return dict(inputs=views, data_samples=[DataSample() for _ in range(batch)])


def build_dino_step(config: str, device: torch.device, batch: Optional[int] = None,
                    cfg_options: Optional[dict] = None,
                    compile_mode: Optional[str] = None,
                    graph_blocks: Optional[bool] = None):
    """The training step of a DINO config, as ``tools/train.py`` runs it.

    The model, its data preprocessor and the optimizer wrapper (the config's own:
    per-parameter clipping, AdamW, fp16 AMP for the shipped configs) are built
    through the registries from the config; one call of the returned function is
    ``model.train_step(data, optim_wrapper)``, the call mmengine's training loop
    makes each iteration (the teacher EMA and both networks' forward passes
    included).

    Args:
        config (str): path of a DINO config.
        device (torch.device): where to train.
        batch (int, optional): images per view; None takes the config's.
        cfg_options (dict, optional): overrides merged into the config, as
            ``--cfg-options``.
        compile_mode (str, optional): compile the student's and the teacher's
            backbones with this ``torch.compile`` mode, as
            :class:`~mmdinomamba.engine.hooks.CompileModulesHook` does.
        graph_blocks (bool, optional): replay the backbones' blocks from CUDA
            graphs, as :class:`~mmdinomamba.engine.hooks.CUDAGraphBlocksHook` does;
            False runs them eagerly; None (default) does what the config says (the
            graphs when its ``custom_hooks`` hold that hook, as in
            ``tools/train.py``).

    Returns:
        tuple: (step function, the model, images per view).
    """
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    from mmpretrain.registry import MODELS

    from mmdinomamba.registry import register_all_modules
    register_all_modules()
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    # as the Runner: names resolve in the config's scope (our optimizer wrappers live
    # in mmpretrain's registries)
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    model_cfg = cfg.model.copy()
    if 'data_preprocessor' in cfg:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    model = MODELS.build(model_cfg)
    model.init_weights()
    model.to(device).train()
    hooked = any(h.get('type') == 'CUDAGraphBlocksHook'
                 for h in cfg.get('custom_hooks', []))
    if graph_blocks or (graph_blocks is None and hooked):
        graphed_blocks.graph_blocks(model)
    if compile_mode:
        compile_submodules(model, ['backbone', 'teacher.backbone'], mode=compile_mode,
                           dynamic=False)
    wrapper_cfg = cfg.optim_wrapper.copy()
    if device.type != 'cuda' and 'Amp' in wrapper_cfg.get('type', ''):
        wrapper_cfg['type'] = wrapper_cfg['type'].replace('Amp', '')  # AMP needs CUDA
    optim_wrapper = build_optim_wrapper(model, wrapper_cfg)
    batch = batch or cfg.train_dataloader.batch_size
    data = dino_views(cfg, batch, device)

    def step():
        return model.train_step(data, optim_wrapper)

    return step, model, batch


def measure_dino_step(config: str, device: torch.device, warmup: int, repeats: int,
                      iters: int, host_batch: int = 2,
                      cfg_options: Optional[dict] = None,
                      compile_mode: Optional[str] = None,
                      graph_blocks: Optional[bool] = None) -> Dict[str, object]:
    """Seconds per iteration, images/s, peak memory, launches and host time of one
    config's DINO step.

    ``host_ms`` is the same step on ``host_batch`` images per view, where the GPU
    waits for the host, so its time is the host's (the issue time of the full
    step cannot be read directly: the AMP loss scaler waits for the device).
    ``peak_gib`` and ``reserved_gib`` are the peaks over every step, the warm-up
    (where CUDA graphs are captured) included; ``steady_reserved_gib`` the
    reservation's peak over the timed steps alone.
    """
    step, model, batch = build_dino_step(config, device, cfg_options=cfg_options,
                                         compile_mode=compile_mode,
                                         graph_blocks=graph_blocks)
    _reset_peak(device)
    for _ in range(warmup):  # captures happen here, with their transient peaks
        step()
    synchronize(device)
    peak, reserved = _peak_gib(device), _peak_reserved_gib(device)
    _reset_peak(device)  # the warm-up's cached blocks too: the timed steps reserve anew
    t = time_ms(step, device, 0, repeats, iters)
    res: Dict[str, object] = dict(
        batch=batch, params_m=sum(p.numel() for p in model.parameters()) / 1e6,
        s_iter=statistics.median(t) / 1e3, ms_all=t,
        img_s=batch * 1e3 / statistics.median(t),
        peak_gib=max(peak, _peak_gib(device)) if peak is not None else None,
        reserved_gib=(max(reserved, _peak_reserved_gib(device))
                      if reserved is not None else None),
        steady_reserved_gib=_peak_reserved_gib(device),
        launches=launches_per_call(step, device),
        pycalls=python_calls_per_call(step),
        ops=operators_per_call(step),
        graph_blocks=any(isinstance(getattr(m, 'stack_runner', None),
                                    graphed_blocks.GraphedStack)
                         for m in model.modules()))
    del step, model
    _reset_peak(device)
    if host_batch:
        small, _, _ = build_dino_step(config, device, batch=host_batch,
                                      cfg_options=cfg_options, compile_mode=compile_mode,
                                      graph_blocks=graph_blocks)
        res['host_ms'] = statistics.median(time_ms(small, device, warmup, repeats, iters))
        del small
    return res


def run_dino_steps(configs: Dict[str, str], device: torch.device, warmup: int,
                   repeats: int, iters: int, baseline: Optional[str] = None,
                   host_batch: int = 2, compile_mode: Optional[str] = None,
                   compile_baseline: bool = False,
                   graph_blocks: Optional[bool] = None, rounds: int = 1) -> List[dict]:
    """:func:`measure_dino_step` for each named config; ``<figure>_vs_baseline``
    ratios (throughput) against the ``baseline`` name. ``compile_mode`` applies to
    every config but the baseline's, unless ``compile_baseline``; ``graph_blocks``
    to every config (True: graphs, False: eager, None: as each config says; the
    baseline's ViT has no graphed blocks). ``rounds``: as in
    :func:`benchmarks.modes.models.run_models`, the configs take turns and each
    keeps its best round."""
    rows = in_rounds(lambda: _measure_dino_all(configs, device, warmup, repeats, iters,
                                               baseline, host_batch, compile_mode,
                                               compile_baseline, graph_blocks),
                     rounds, _DINO_TIMED, ('host_ms', ))
    base = next((r for r in rows if r['model'] == baseline and 'img_s' in r), None)
    for r in rows:
        if base is not None and 'img_s' in r:
            r['img_s_vs_baseline'] = r['img_s'] / base['img_s']
    return rows


def _measure_dino_all(configs, device, warmup, repeats, iters, baseline, host_batch,
                      compile_mode, compile_baseline, graph_blocks) -> List[dict]:
    """One round of :func:`run_dino_steps`, each row printed as it comes."""
    rows = []
    for name, config in configs.items():
        row = dict(model=name, config=config)
        try:
            mode = compile_mode if compile_baseline or name != baseline else None
            row['compile'] = mode
            row.update(measure_dino_step(config, device, warmup, repeats, iters,
                                         host_batch, compile_mode=mode,
                                         graph_blocks=graph_blocks))
        except Exception as e:  # OOM, a config that does not build: report, go on
            row['error'] = f'{type(e).__name__}: {e}'.splitlines()[0][:300]
            traceback.print_exc()
        _reset_peak(device)
        rows.append(row)
        print(format_dino_row(row), flush=True)
    return rows


def _dino_path(r: dict) -> str:
    """How the backbones ran: a compile mode, 'graph-blocks' or 'eager'."""
    return r.get('compile') or ('graph-blocks' if r.get('graph_blocks') else 'eager')


def format_dino_row(r: dict) -> str:
    if 'error' in r:
        return f"{r['model']:<20}  ERROR {r['error']}"
    return (f"{r['model']:<20} {r['batch']:>5} {r['s_iter']:8.3f} {r['img_s']:9.1f} "
            f"{_fmt(r.get('img_s_vs_baseline'), '5.2f'):>5} "
            f"{_fmt(r.get('host_ms'), '8.1f')} {_fmt(r.get('launches'), '8d')} "
            f"{_fmt(r.get('pycalls'), '8d')} {_fmt(r.get('ops'), '8d')} "
            f"{_fmt(r.get('peak_gib'), '7.2f')} "
            f"{_fmt(r.get('reserved_gib'), '7.2f')} "
            f"{_fmt(r.get('steady_reserved_gib'), '7.2f')}  {_dino_path(r)}")


def format_dino_table(rows: List[dict], baseline: Optional[str]) -> str:
    ratio = f"x{baseline or '-'}"[:5]
    head = (f"{'model':<20} {'batch':>5} {'s/iter':>8} {'img/s':>9} {ratio:>5} "
            f"{'hostMs':>8} {'launches':>8} {'pyCalls':>8} {'torchOps':>8} "
            f"{'peakGiB':>7} {'resGiB':>7} "
            f"{'steady':>7}  compile")
    return '\n'.join([head, '-' * len(head)] + [format_dino_row(r) for r in rows])



def run(args, device: torch.device, amp: Optional[torch.dtype], result: dict) -> None:
    """The mode's part of the command line: the baseline's config first."""
    baseline = None if args.no_baseline else DINO_BASELINE
    names = ([baseline] if baseline else []) + [
        n for n in args.models if n != baseline]
    configs = {n: osp.join(args.config_dir, DINO_CONFIGS[n]) for n in names}
    result['settings'].update(configs=configs, host_batch=args.host_batch,
                              compile=args.compile,
                              compile_baseline=args.compile_baseline,
                              graph_blocks=args.graph_blocks, rounds=args.rounds)
    rows = run_dino_steps(configs, device, args.warmup, args.repeats, args.iters,
                          baseline, args.host_batch, args.compile,
                          args.compile_baseline, args.graph_blocks, args.rounds)
    result['rows'] = rows
    if args.rounds > 1:
        print(f'best of {args.rounds} rounds per config:')
    print(format_dino_table(rows, baseline))
