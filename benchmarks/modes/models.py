"""The ``models`` mode: backbone throughput, host work and memory.

For each backbone (the zoo's MLLA, DinoVim, LinearViT and ViT-B, mmpretrain's
Swin-T), input size and batch size: inference throughput (``torch.no_grad``,
autocast), training-step throughput (forward, backward and an AdamW step, fused
on CUDA as in the shipped schedules) and peak memory, eager and optionally
replayed from a CUDA graph (no host launch overhead), with the host time to
issue one eager step of each mode (the table's ``iHostMs`` and ``hostMs``: a
step whose time is about its host time is bound by the host, not the GPU), and
the training step's kernel launches, Python calls and torch operators, each
figure with its ratio to the baseline (ViT-B: mmpretrain's ``VisionTransformer``
when it imports, else timm's ``vit_base_patch16_224``).
"""
from __future__ import annotations

import statistics
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import torch

from mmdinomamba.engine import graphed_blocks
from mmdinomamba.ops import resolve_backend

from ..common import (_autocast, _first, _fmt, _peak_gib, _reset_peak,
                      build_model, host_ms, in_rounds, launches_per_call, model_table,
                      operators_per_call, partial_writer, python_calls_per_call,
                      time_ms)
from ..names import BASELINE, COMPILE_SCOPES

def cuda_graph(fn: Callable[[], object], device: torch.device,
               warmup: int) -> Callable[[], None]:
    """Capture ``fn`` (after ``warmup`` calls on a side stream) in a CUDA graph;
    return its replay. Its tensors are static: replays recompute the same step."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _steps(model: torch.nn.Module, x: torch.Tensor, device: torch.device,
           amp: Optional[torch.dtype], graph: bool):
    """The inference and training-step callables (graph: capture-safe variants)."""
    def infer():
        with torch.no_grad(), _autocast(device, amp, cache=not graph):
            return _first(model(x))

    # capturable: the step counters live on the device, as graph replay needs;
    # fused on CUDA, as the shipped schedules configure it (a few launches per step,
    # where the multi-tensor path issues several per group and reads each step
    # counter back on the host)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05,
                                  capturable=graph, fused=device.type == 'cuda')

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, amp, cache=not graph):
            out = _first(model(x))
        loss = out.float().pow(2).mean()
        loss.backward()
        optimizer.step()

    return infer, train_step


def measure_model(model: torch.nn.Module, img_size: int, batch: int,
                  device: torch.device, amp: Optional[torch.dtype], modes: Sequence[str],
                  warmup: int, repeats: int, iters: int,
                  graph: bool = False,
                  compile_mode: Optional[str] = None,
                  graph_blocks: bool = False,
                  compile_scope: str = 'model') -> Dict[str, object]:
    """Inference and training-step figures of one model at one (size, batch).

    Eager figures always (with ``compile_mode``, a ``torch.compile`` mode, the
    model is compiled in place first, and the "eager" figures are the compiled
    model's: its steps run as a user's loop would run them); with ``graph`` also
    the same steps replayed from a CUDA graph of our own (``*_graph_*`` keys),
    which removes the host's launch overhead. ``graph_blocks``: DinoVim's blocks
    replayed from CUDA graphs in the eager steps
    (:func:`mmdinomamba.engine.graphed_blocks.graph_blocks`). Peak
    memory is the first run's.
    """
    model.to(device)
    if graph_blocks:
        graphed_blocks.graph_blocks(model)
    if compile_mode:
        compile_model(model, compile_mode, compile_scope)
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    res: Dict[str, object] = dict(
        params_m=sum(p.numel() for p in model.parameters()) / 1e6)
    for mode in ('infer', 'train'):
        if mode not in modes:
            continue
        model.train(mode == 'train')
        _reset_peak(device)
        step = _steps(model, x, device, amp, graph=False)[mode == 'train']
        t = time_ms(step, device, warmup, repeats, iters)
        res.update({f'{mode}_ms': statistics.median(t), f'{mode}_ms_all': t,
                    f'{mode}_img_s': batch * 1e3 / statistics.median(t),
                    f'{mode}_peak_gib': _peak_gib(device)})
        res[f'{mode}_pycalls'] = python_calls_per_call(step)
        res[f'{mode}_ops'] = operators_per_call(step)
        if device.type == 'cuda':
            res.update({f'{mode}_host_ms': statistics.median(host_ms(step, device, repeats)),
                        f'{mode}_launches': launches_per_call(step, device)})
        del step
        if not graph:
            continue
        try:
            model.zero_grad(set_to_none=True)
            replay = cuda_graph(_steps(model, x, device, amp, graph=True)[mode == 'train'],
                                device, warmup)
            t = time_ms(replay, device, warmup, repeats, iters)
            res.update({f'{mode}_graph_ms': statistics.median(t),
                        f'{mode}_graph_img_s': batch * 1e3 / statistics.median(t)})
            del replay
        except Exception as e:  # a model whose step cannot be captured
            res[f'{mode}_graph_error'] = f'{type(e).__name__}: {e}'.splitlines()[0][:300]
            traceback.print_exc()
        model.zero_grad(set_to_none=True)
    return res


def compile_model(model: torch.nn.Module, mode: str, scope: str = 'model') -> None:
    """``torch.compile`` a backbone in place (``dynamic=False``).

    ``scope='model'`` compiles the whole model (what ``CompileModulesHook`` does
    with ``modules=['backbone']``); ``'blocks'`` compiles each block on its own
    (regional compilation): every child of each ``nn.ModuleList`` that holds no
    other ``ModuleList`` (ViT's ``layers``, Swin's and MLLA's stages' ``blocks``,
    DinoVim's ``layers``), the rest eager. Blocks of one class and shape share
    one compiled graph, so compiling costs about one block per stage instead of
    the whole network; a DinoVim's stack runs fused kernels
    (:func:`mmdinomamba.ops.run_blocks`) that do not call its block modules, so
    there it changes nothing.
    """
    if scope == 'model':
        model.compile(mode=mode, dynamic=False)
        return
    if scope != 'blocks':
        raise ValueError(f'benchmark: compile scope must be one of {COMPILE_SCOPES}, '
                         f'got {scope!r}')
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)
             and not any(isinstance(c, torch.nn.ModuleList) for c in m.modules()
                         if c is not m)]
    if not lists:
        raise ValueError(f'benchmark: {type(model).__name__} has no block list '
                         "(nn.ModuleList) to compile; use --compile-scope model")
    for blocks in lists:
        for block in blocks:
            block.compile(mode=mode, dynamic=False)


def _ssd_path(model: torch.nn.Module, device: torch.device) -> str:
    """Which SSD path a DinoVim takes on ``device`` ('fused-triton' or a backend)."""
    mixer = next((m for m in model.modules() if hasattr(m, 'uses_fused_path')), None)
    if mixer is None:
        return '-'
    probe = torch.empty(1, 1, mixer.in_proj.out_features, device=device,
                        dtype=torch.bfloat16 if device.type == 'cuda' else torch.float32)
    if mixer.uses_fused_path(probe):
        return 'fused-triton'
    return resolve_backend(mixer.ssd_backend, device)


def run_models(specs: Dict[str, dict], sizes: Sequence[int], batches: Sequence[int],
               device: torch.device, amp: Optional[torch.dtype], modes: Sequence[str],
               warmup: int, repeats: int, iters: int,
               baseline: Optional[str] = BASELINE, graph: bool = False,
               compile_mode: Optional[str] = None,
               graph_blocks: bool = False, rounds: int = 1,
               on_row: Optional[Callable[[List[dict]], None]] = None,
               compile_scope: str = 'model') -> List[dict]:
    """Measure every (model, size) pair; add ratios to ``baseline`` (a key of specs).

    With ``rounds`` > 1 every pair is measured that many times, the models taking
    turns (baseline, A, B, baseline, A, B, ...), and each row keeps its best round
    (:func:`best_of_rounds`): a shared machine's host slows down by up to 2-3x for
    tens of seconds at a time (README.md, "The host's drift"), which one
    round per model turns into a ratio of two unlike machines. ``on_row(rows)``
    is called with the rows of the round so far after each one (to save them).

    Returns:
        list[dict]: one row per (model, size) with the figures of
        :func:`measure_model`, ``error`` when it failed, and ``*_vs_baseline``.
    """
    if graph and compile_mode:
        raise ValueError('benchmark: --cuda-graph captures eager steps; measure '
                         '--compile in a separate run')
    if len(sizes) != len(batches):
        raise ValueError(f'benchmark: give one batch size per input size, got sizes '
                         f'{list(sizes)} and batch sizes {list(batches)}')
    rows = in_rounds(lambda: _measure_all(specs, sizes, batches, device, amp, modes,
                                          warmup, repeats, iters, graph, compile_mode,
                                          graph_blocks, on_row, compile_scope), rounds)
    add_ratios(rows, baseline)
    return rows


def _measure_all(specs, sizes, batches, device, amp, modes, warmup, repeats, iters,
                 graph, compile_mode, graph_blocks, on_row=None,
                 compile_scope='model') -> List[dict]:
    """One round of :func:`run_models`: a row per (size, model), printed as it
    comes. With ``compile_mode`` every model starts from an empty compile cache
    (``torch._dynamo.reset``), under a recompile limit that its blocks' shapes and
    both grad modes fit in (the default 8 would fall back to eager unseen)."""
    if compile_mode:
        import torch._dynamo
        for key in ('recompile_limit', 'cache_size_limit'):
            if hasattr(torch._dynamo.config, key):
                setattr(torch._dynamo.config, key, 64)
    rows = []
    for size, batch in zip(sizes, batches):
        for name, spec in specs.items():
            row = dict(model=name, img_size=size, batch=batch)
            if compile_mode:
                row['compile'] = f'{compile_mode}, {compile_scope}'
                torch._dynamo.reset()
            try:
                model = build_model(spec, size)
                row['source'] = getattr(model, 'baseline_source', spec['type'])
                row['ssd_path'] = _ssd_path(model, device)
                row.update(measure_model(model, size, batch, device, amp, modes,
                                         warmup, repeats, iters, graph, compile_mode,
                                         graph_blocks, compile_scope))
            except Exception as e:  # OOM, a missing baseline: report and go on
                row['error'] = f'{type(e).__name__}: {e}'.splitlines()[0][:300]
                traceback.print_exc()
            finally:
                model = None
                _reset_peak(device)
            rows.append(row)
            print(format_row(row), flush=True)
            if on_row is not None:
                on_row(rows)
    return rows



def add_ratios(rows: List[dict], baseline: Optional[str]):
    """Add ``<figure>_vs_baseline`` (throughput ratio) to rows of the same size and batch."""
    base = {(r['img_size'], r['batch']): r for r in rows if r['model'] == baseline}
    for r in rows:
        b = base.get((r['img_size'], r['batch']))
        for key in ('infer_img_s', 'train_img_s', 'infer_graph_img_s',
                    'train_graph_img_s'):
            if b is not None and key in r and b.get(key):
                r[key.replace('_img_s', '_vs_baseline')] = r[key] / b[key]



def format_row(r: dict) -> str:
    if 'error' in r:
        return f"{r['model']:<24} {r['img_size']:>5} {r['batch']:>5}  ERROR {r['error']}"
    cells = [f"{r['model']:<24} {r['img_size']:>5} {r['batch']:>5}"]
    for key in ('infer', 'train', 'infer_graph', 'train_graph'):
        cells.append(f"{_fmt(r.get(key + '_img_s'), '9.1f')} "
                     f"{_fmt(r.get(key + '_vs_baseline'), '5.2f'):>5}")
    cells.append(f"{_fmt(r.get('train_peak_gib'), '8.2f')} "
                 f"{_fmt(r.get('infer_peak_gib'), '8.2f')} "
                 f"{_fmt(r.get('infer_host_ms'), '8.1f')} "
                 f"{_fmt(r.get('train_host_ms'), '9.1f')} "
                 f"{_fmt(r.get('train_launches'), '8d')} "
                 f"{_fmt(r.get('train_pycalls'), '8d')} "
                 f"{_fmt(r.get('train_ops'), '8d')}  {r.get('ssd_path', '')}")
    return ' '.join(cells)


def format_table(rows: List[dict], baseline: Optional[str]) -> str:
    ratio = f"x{baseline or '-'}"[:5]
    head = (f"{'model':<24} {'px':>5} {'batch':>5} "
            + ' '.join(f'{name:>9} {ratio:>5}' for name in
                       ('infer/s', 'train/s', 'gInfer/s', 'gTrain/s'))
            + f" {'trainGiB':>8} {'inferGiB':>8} {'iHostMs':>8} {'hostMs':>9} "
            f"{'launches':>8} "
            f"{'pyCalls':>8} {'torchOps':>8}  ssd")
    return '\n'.join([head, '-' * len(head)] + [format_row(r) for r in rows])



def run(args, device: torch.device, amp: Optional[torch.dtype], result: dict) -> None:
    """The mode's part of the command line: measure ``args.models`` (the baseline
    first, ``-official`` rows beside each MLLA with ``--official-mlla``)."""
    baseline = None if args.no_baseline else args.baseline
    specs = {}
    for name in ([baseline] if baseline else []) + args.models:  # baseline first
        spec = dict(model_table()[name])
        if spec['type'] == 'DinoVim':
            spec['mixer_cfg'] = dict(ssd_backend=args.ssd_backend)
        if args.official_mlla and spec['type'] == 'MLLA' and len(spec) == 2:
            specs[f'{name}-official'] = dict(type='OfficialMLLA', arch=spec['arch'],
                                             path=args.official_mlla)
        specs[name] = spec
    result['settings'].update(baseline=baseline, sizes=args.sizes,
                              batch_sizes=args.batch_sizes,
                              modes=args.modes, ssd_backend=args.ssd_backend,
                              cuda_graph=args.cuda_graph, compile=args.compile,
                              compile_scope=args.compile_scope,
                              graph_blocks=args.graph_blocks, rounds=args.rounds,
                              official_mlla=args.official_mlla)
    if args.cuda_graph and device.type != 'cuda':
        raise ValueError('benchmark: --cuda-graph needs a CUDA device')
    rows = run_models(specs, args.sizes, args.batch_sizes, device, amp, args.modes,
                      args.warmup, args.repeats, args.iters, baseline,
                      args.cuda_graph, args.compile, args.graph_blocks, args.rounds,
                      on_row=partial_writer(result, args.out),
                      compile_scope=args.compile_scope)
    result['rows'] = rows
    if args.rounds > 1:
        print(f'best of {args.rounds} rounds per model:')
    print(format_table(rows, baseline))
