"""Speed and memory of the backbones, and of the SSD op alone.

Three modes, each measured in one process so that ratios compare like with like:

* ``models``: for each backbone, input size and batch size, inference throughput
  (``torch.no_grad``, autocast), training-step throughput (forward, backward and
  an AdamW step) and peak memory, optionally also with each step replayed from a
  CUDA graph (``--cuda-graph``: no host launch overhead), with each figure's ratio
  to the baseline (ViT-B:
  mmpretrain's ``VisionTransformer`` when it imports, else timm's
  ``vit_base_patch16_224``, which uses PyTorch's SDPA attention);
* ``kernel``: the SSD op (:func:`mmdinomamba.ops.ssd`) on its own, forward and
  forward + backward, for each backend that runs on the device;
* ``profile``: where one inference or training step of one model spends its
  time, per kernel (``torch.profiler``; per operator on a CPU).

Every timing is the median over ``--repeats`` timed runs of ``--iters`` steps each,
after ``--warmup`` untimed steps, with the device synchronised around each run.
The table goes to stdout; ``--out`` writes the full results as JSON (atomically).

Examples::

    python tools/analysis/benchmark.py models --sizes 224 1024 --batch-sizes 128 4 \\
        --out work_dirs/benchmark.json
    python tools/analysis/benchmark.py kernel --batch 128 --seqlen 198
    python tools/analysis/benchmark.py profile --model dinovim-b --step train
"""
import argparse
import datetime
import os.path as osp
import platform
import statistics
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import torch

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))

from mmdinomamba.engine.checkpoint import dump_atomic  # noqa: E402
from mmdinomamba.models.backbones import DinoVim, LinearViT  # noqa: E402
from mmdinomamba.ops import BACKENDS, resolve_backend, ssd, triton_available  # noqa: E402

# Backbones by name; 'vit-b' is the baseline every ratio refers to.
MODELS = {
    'dinovim-t': dict(type='DinoVim', arch='tiny'),
    'dinovim-s': dict(type='DinoVim', arch='small'),
    'dinovim-b': dict(type='DinoVim', arch='base'),
    'reg-b': dict(type='DinoVim', arch='base', num_registers=12),
    'linearvit-b': dict(type='LinearViT', arch='base'),
    'vit-b': dict(type='ViT', arch='base'),
}
BASELINE = 'vit-b'
AMP_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'none': None}
DROP_PATH_RATE = 0.1


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #
def synchronize(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int,
            iters: int) -> List[float]:
    """Milliseconds per call of ``fn``: one figure per repeat of ``iters`` calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == 'cuda':
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / iters)
    return times


def _peak_gib(device: torch.device) -> Optional[float]:
    if device.type != 'cuda':
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def _reset_peak(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# --------------------------------------------------------------------------- #
# Models
# --------------------------------------------------------------------------- #
def build_vit_b(img_size: int) -> torch.nn.Module:
    """ViT-B/16 baseline: mmpretrain's when it imports, else timm's (SDPA)."""
    try:
        from mmpretrain.models import VisionTransformer
    except Exception:  # mmpretrain (or mmcv under it) missing
        VisionTransformer = None
    if VisionTransformer is not None:
        model = VisionTransformer(arch='base', img_size=img_size, patch_size=16,
                                  drop_path_rate=DROP_PATH_RATE, out_type='cls_token')
        model.baseline_source = 'mmpretrain.VisionTransformer'
        return model
    try:
        import timm
    except ImportError as e:
        raise RuntimeError('the ViT-B baseline needs mmpretrain or timm') from e
    model = timm.create_model('vit_base_patch16_224', pretrained=False, num_classes=0,
                              img_size=img_size, drop_path_rate=DROP_PATH_RATE)
    model.baseline_source = f'timm {timm.__version__} vit_base_patch16_224'
    return model


def build_model(spec: dict, img_size: int) -> torch.nn.Module:
    """A backbone from a :data:`MODELS`-style spec, sized for ``img_size``."""
    cfg = dict(spec)
    kind = cfg.pop('type')
    if kind == 'ViT':
        return build_vit_b(img_size)
    cls = {'DinoVim': DinoVim, 'LinearViT': LinearViT}.get(kind)
    if cls is None:
        raise ValueError(f'benchmark: unknown model type {kind!r}; choose one of '
                         "'DinoVim', 'LinearViT', 'ViT'")
    cfg.setdefault('drop_path_rate', DROP_PATH_RATE)
    return cls(img_size=img_size, **cfg)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _autocast(device: torch.device, amp: Optional[torch.dtype], cache: bool = True):
    return torch.autocast(device.type, dtype=amp or torch.float32,
                          enabled=amp is not None, cache_enabled=cache)


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

    # capturable: the step counters live on the device, as graph replay needs
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05,
                                  capturable=graph)

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
                  graph: bool = False) -> Dict[str, object]:
    """Inference and training-step figures of one model at one (size, batch).

    Eager figures always; with ``graph`` also the same steps replayed from a CUDA
    graph (``*_graph_*`` keys), which removes the host's launch overhead. Peak
    memory is the eager run's.
    """
    model.to(device)
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
               baseline: Optional[str] = BASELINE, graph: bool = False) -> List[dict]:
    """Measure every (model, size) pair; add ratios to ``baseline`` (a key of specs).

    Returns:
        list[dict]: one row per (model, size) with the figures of
        :func:`measure_model`, ``error`` when it failed, and ``*_vs_baseline``.
    """
    if len(sizes) != len(batches):
        raise ValueError(f'benchmark: give one batch size per input size, got sizes '
                         f'{list(sizes)} and batch sizes {list(batches)}')
    rows = []
    for size, batch in zip(sizes, batches):
        for name, spec in specs.items():
            row = dict(model=name, img_size=size, batch=batch)
            try:
                model = build_model(spec, size)
                row['source'] = getattr(model, 'baseline_source', spec['type'])
                row['ssd_path'] = _ssd_path(model, device)
                row.update(measure_model(model, size, batch, device, amp, modes,
                                         warmup, repeats, iters, graph))
            except Exception as e:  # OOM, a missing baseline: report and go on
                row['error'] = f'{type(e).__name__}: {e}'.splitlines()[0][:300]
                traceback.print_exc()
            finally:
                model = None
                _reset_peak(device)
            rows.append(row)
            print(format_row(row), flush=True)
    add_ratios(rows, baseline)
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


def _fmt(v, spec: str) -> str:
    return '-' if v is None else format(v, spec)


def format_row(r: dict) -> str:
    if 'error' in r:
        return f"{r['model']:<12} {r['img_size']:>5} {r['batch']:>5}  ERROR {r['error']}"
    cells = [f"{r['model']:<12} {r['img_size']:>5} {r['batch']:>5}"]
    for key in ('infer', 'train', 'infer_graph', 'train_graph'):
        cells.append(f"{_fmt(r.get(key + '_img_s'), '9.1f')} "
                     f"{_fmt(r.get(key + '_vs_baseline'), '5.2f'):>5}")
    cells.append(f"{_fmt(r.get('train_peak_gib'), '8.2f')} "
                 f"{_fmt(r.get('infer_peak_gib'), '8.2f')}  {r.get('ssd_path', '')}")
    return ' '.join(cells)


def format_table(rows: List[dict], baseline: Optional[str]) -> str:
    ratio = f"x{baseline or '-'}"[:5]
    head = (f"{'model':<12} {'px':>5} {'batch':>5} "
            + ' '.join(f'{name:>9} {ratio:>5}' for name in
                       ('infer/s', 'train/s', 'gInfer/s', 'gTrain/s'))
            + f" {'trainGiB':>8} {'inferGiB':>8}  ssd")
    return '\n'.join([head, '-' * len(head)] + [format_row(r) for r in rows])


# --------------------------------------------------------------------------- #
# Kernel mode
# --------------------------------------------------------------------------- #
def ssd_inputs(batch: int, seqlen: int, nheads: int, headdim: int, dstate: int,
               ngroups: int, device: torch.device, dtype: torch.dtype,
               generator: torch.Generator) -> Dict[str, torch.Tensor]:
    """Random SSD arguments shaped like one direction of a DinoVim mixer."""
    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=generator, device='cpu').to(device, dt)

    return dict(
        x=randn(batch, seqlen, nheads, headdim), dt=randn(batch, seqlen, nheads),
        A=-torch.linspace(1, 16, nheads, device=device),
        B=randn(batch, seqlen, ngroups, dstate), C=randn(batch, seqlen, ngroups, dstate),
        D=torch.ones(nheads, device=device),
        dt_bias=torch.linspace(-6.9, -2.3, nheads, device=device))


def run_kernel(backends: Sequence[str], batch: int, seqlen: int, nheads: int,
               headdim: int, dstate: int, ngroups: int, device: torch.device,
               dtype: torch.dtype, warmup: int, repeats: int, iters: int) -> List[dict]:
    """Forward and forward+backward milliseconds of :func:`ssd` per backend."""
    gen = torch.Generator().manual_seed(0)
    inputs = ssd_inputs(batch, seqlen, nheads, headdim, dstate, ngroups, device, dtype,
                        gen)
    grad_names = ('x', 'dt', 'B', 'C')
    rows = []
    for backend in backends:
        row = dict(backend=backend, batch=batch, seqlen=seqlen, nheads=nheads,
                   headdim=headdim, dstate=dstate, ngroups=ngroups, dtype=str(dtype))
        try:
            resolve_backend(backend, device)

            def fwd():
                with torch.no_grad():
                    return ssd(**inputs, dt_softplus=True, backend=backend)

            leaves = {k: v.detach().requires_grad_(k in grad_names)
                      for k, v in inputs.items()}
            dy = torch.randn(batch, seqlen, nheads, headdim, generator=gen).to(device, dtype)

            def fwd_bwd():
                y = ssd(**leaves, dt_softplus=True, backend=backend)
                torch.autograd.grad(y, [leaves[k] for k in grad_names], dy)

            t = time_ms(fwd, device, warmup, repeats, iters)
            row.update(fwd_ms=statistics.median(t), fwd_ms_all=t)
            t = time_ms(fwd_bwd, device, warmup, repeats, iters)
            row.update(fwd_bwd_ms=statistics.median(t), fwd_bwd_ms_all=t)
        except Exception as e:  # a backend missing here, or OOM
            row['error'] = f'{type(e).__name__}: {e}'.splitlines()[0][:300]
        rows.append(row)
        print(f"{backend:<10} fwd {_fmt(row.get('fwd_ms'), '9.3f')} ms   fwd+bwd "
              f"{_fmt(row.get('fwd_bwd_ms'), '9.3f')} ms  {row.get('error', '')}",
              flush=True)
    return rows


# --------------------------------------------------------------------------- #
# Profile mode
# --------------------------------------------------------------------------- #
def profile_model(spec: dict, img_size: int, batch: int, device: torch.device,
                  amp: Optional[torch.dtype], step: str, warmup: int,
                  iters: int) -> List[dict]:
    """Where one step's time goes, per kernel (CUDA) or per operator (CPU).

    Runs ``warmup`` steps, then profiles ``iters`` steps with ``torch.profiler``:
    on CUDA the device time of each kernel, on the CPU the self time of each
    operator. Returns rows ``name, ms_per_step, calls_per_step``, largest first.
    """
    from torch.profiler import ProfilerActivity, profile
    if step not in ('infer', 'train'):
        raise ValueError(f"benchmark: step must be 'infer' or 'train', got {step!r}")
    model = build_model(spec, img_size).to(device).train(step == 'train')
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    fn = _steps(model, x, device, amp, graph=False)[step == 'train']
    for _ in range(warmup):
        fn()
    synchronize(device)
    cuda = device.type == 'cuda'
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn()
        synchronize(device)
    rows = []
    for event in prof.key_averages():
        total_us = event.device_time_total if cuda else event.self_cpu_time_total
        if total_us > 0:
            rows.append(dict(name=event.key, ms_per_step=total_us / iters / 1e3,
                             calls_per_step=event.count / iters))
    return sorted(rows, key=lambda r: -r['ms_per_step'])


def format_profile(rows: List[dict], top: int) -> str:
    total = sum(r['ms_per_step'] for r in rows)
    lines = [f'total {total:.3f} ms per step; the {min(top, len(rows))} largest:',
             f"{'ms/step':>9} {'share':>6} {'calls':>6}  name"]
    for r in rows[:top]:
        lines.append(f"{r['ms_per_step']:9.3f} {r['ms_per_step'] / total:6.1%} "
                     f"{r['calls_per_step']:6.0f}  {r['name'][:90]}")
    return '\n'.join(lines)


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #
def environment(device: torch.device) -> dict:
    env = dict(date=datetime.date.today().isoformat(), torch=torch.__version__,
               python=platform.python_version(), device=str(device),
               triton_available=triton_available())
    if device.type == 'cuda':
        env['gpu'] = torch.cuda.get_device_name(device)
        try:
            import triton
            env['triton'] = triton.__version__
        except ImportError:
            pass
    else:
        env['cpu'] = platform.processor() or platform.machine()
    return env


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES), default='bf16',
                        help='autocast dtype (kernel mode: input dtype)')
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--iters', type=int, default=3, help='steps per timed repeat')
    parser.add_argument('--out', help='write results as JSON here')
    sub = parser.add_subparsers(dest='mode', required=True)
    m = sub.add_parser('models', help='backbone throughput and memory')
    m.add_argument('--models', nargs='+', choices=sorted(MODELS),
                   default=['dinovim-t', 'dinovim-s', 'dinovim-b', 'reg-b',
                            'linearvit-b'])
    m.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024])
    m.add_argument('--batch-sizes', nargs='+', type=int, default=[128, 16, 4],
                   help='one per size')
    m.add_argument('--modes', nargs='+', choices=['infer', 'train'],
                   default=['infer', 'train'])
    m.add_argument('--ssd-backend', choices=BACKENDS, default='auto',
                   help="DinoVim mixers' ssd_backend ('auto': fused Triton on CUDA)")
    m.add_argument('--no-baseline', action='store_true',
                   help=f'skip the {BASELINE} baseline (no ratios)')
    m.add_argument('--cuda-graph', action='store_true',
                   help='also time each step replayed from a CUDA graph (gInfer, gTrain)')
    k = sub.add_parser('kernel', help='the SSD op alone')
    k.add_argument('--backends', nargs='+', choices=[b for b in BACKENDS if b != 'auto'],
                   default=['chunked', 'triton', 'mamba_ssm'])
    k.add_argument('--batch', type=int, default=128)
    k.add_argument('--seqlen', type=int, default=198)
    k.add_argument('--nheads', type=int, default=24)
    k.add_argument('--headdim', type=int, default=64)
    k.add_argument('--dstate', type=int, default=64)
    k.add_argument('--ngroups', type=int, default=1)
    p = sub.add_parser('profile', help='time per kernel of one step of one model')
    p.add_argument('--model', choices=sorted(MODELS), default='dinovim-b')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--step', choices=['infer', 'train'], default='train')
    p.add_argument('--top', type=int, default=20, help='rows to print')
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    amp = AMP_DTYPES[args.amp]
    result = dict(mode=args.mode, environment=environment(device),
                  settings=dict(amp=args.amp, warmup=args.warmup, repeats=args.repeats,
                                iters=args.iters), command=' '.join(sys.argv))
    if args.mode == 'models':
        baseline = None if args.no_baseline else BASELINE
        specs = {baseline: MODELS[baseline]} if baseline else {}  # measured first
        for name in args.models:
            spec = dict(MODELS[name])
            if spec['type'] == 'DinoVim':
                spec['mixer_cfg'] = dict(ssd_backend=args.ssd_backend)
            specs[name] = spec
        result['settings'].update(sizes=args.sizes, batch_sizes=args.batch_sizes,
                                  modes=args.modes, ssd_backend=args.ssd_backend,
                                  cuda_graph=args.cuda_graph)
        if args.cuda_graph and device.type != 'cuda':
            raise ValueError('benchmark: --cuda-graph needs a CUDA device')
        rows = run_models(specs, args.sizes, args.batch_sizes, device, amp, args.modes,
                          args.warmup, args.repeats, args.iters, baseline,
                          args.cuda_graph)
        result['rows'] = rows
        print(format_table(rows, baseline))
    elif args.mode == 'profile':
        result['settings'].update(model=args.model, size=args.size, batch=args.batch,
                                  step=args.step)
        rows = profile_model(MODELS[args.model], args.size, args.batch, device, amp,
                             args.step, args.warmup, args.iters)
        result['rows'] = rows
        print(format_profile(rows, args.top))
    else:
        rows = run_kernel(args.backends, args.batch, args.seqlen, args.nheads,
                          args.headdim, args.dstate, args.ngroups, device,
                          amp or torch.float32, args.warmup, args.repeats, args.iters)
        result['rows'] = rows
    if args.out:
        dump_atomic(result, args.out)
    return result


if __name__ == '__main__':
    main()
