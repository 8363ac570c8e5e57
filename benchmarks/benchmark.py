"""Speed and memory of the backbones, of the DINO training step and of the SSD op.

A benchmark beside the package (it is not installed with it), run from a checkout::

    python benchmarks/benchmark.py dino-step            # the shipped DINO configs
    python benchmarks/benchmark.py models --sizes 224 1024 --batch-sizes 128 4 \\
        --out work_dirs/benchmark.json
    python benchmarks/benchmark.py --device cpu host    # the fused path's host work
    python benchmarks/benchmark.py kernel --batch 128 --seqlen 198
    python benchmarks/benchmark.py profile --model dinovim-base --step train
    python benchmarks/benchmark.py --amp bf16 loop --task cls --models mlla-tiny \
        swin-tiny --size 224 --batch 128      # tools/train.py, synthetic data

``benchmarks/README.md`` says what each mode measures and holds the current figures.
Every mode but ``loop`` measures in one process, so that ratios compare like with
like; the table goes to stdout and ``--out`` writes the full results as JSON
(atomically; ``models`` and ``loop`` also after each row, marked ``partial``).
Models are named once for every mode (:data:`MODELS`: mmpretrain-style names,
short aliases accepted):

* :func:`run_models` (``models``): for each backbone (MLLA, DinoVim, LinearViT,
  mmpretrain's ViT-B and Swin-T), input size and batch size,
  inference throughput (``torch.no_grad``, autocast), training-step throughput
  (forward, backward and an AdamW step, fused on CUDA as in the shipped schedules)
  and peak memory, eager and optionally replayed from a CUDA graph (no host launch
  overhead), with the host time to issue one eager step of each mode (the table's
  ``iHostMs`` and ``hostMs``: a step whose time is about its host time is bound by
  the host, not the GPU), and the training step's kernel launches, Python calls and
  torch operators, each figure with its ratio to the baseline (ViT-B:
  mmpretrain's ``VisionTransformer`` when it imports, else timm's
  ``vit_base_patch16_224``);
* :func:`run_dino_steps` (``dino-step``): the paper's DINO training step built from
  a shipped config through the registry (student on every crop, teacher on the
  global ones, the DINO head and loss, per-parameter clipping, AdamW, the teacher
  EMA), as ``Runner.train_step`` runs it;
* :func:`run_host` (``host``): the host's work for an eager DinoVim training step
  through the fused CUDA path, timed and counted on a CPU with the kernels skipped
  (no GPU host's drift; :func:`mmdinomamba.ops.skip_kernels`);
* :func:`run_kernel` (``kernel``): the SSD op (:func:`mmdinomamba.ops.ssd_scan`) on
  its own;
* :func:`profile_model` (``profile``): where one step of one model spends its time;
* :func:`run_loop` (``loop``): ``tools/train.py`` as users run it, with the shipped
  classification or DINO configs on synthetic ImageNet-layout JPEGs, one process
  per model: s/iter, images/s and peak memory from mmengine's log.

Every timing but the loop's is the median over ``repeats`` timed runs of
``iters`` steps each, after ``warmup`` untimed steps, with the device
synchronised around each run.
"""
from __future__ import annotations  # annotations name torch types: not evaluated

import argparse
import contextlib
import datetime
import gc
import os
import os.path as osp
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from typing import Callable, Dict, Iterator, List, Optional, Sequence

# torch and the package: bound by load_runtime(), which parse_args() calls once the
# arguments are parsed, so that --help answers at once (code that imports this file
# to call its functions calls load_runtime() first)
torch = graphed_blocks = dump_atomic = compile_submodules = None
MLLA = DinoVim = LinearViT = None
BACKENDS = resolve_backend = skip_kernels = ssd_scan = triton_available = None


def load_runtime() -> None:
    """Import torch and the package's parts this harness uses into its globals."""
    global torch, graphed_blocks, dump_atomic, compile_submodules, MLLA, DinoVim, \
        LinearViT, BACKENDS, resolve_backend, skip_kernels, ssd_scan, triton_available
    import torch

    from mmdinomamba.engine import graphed_blocks
    from mmdinomamba.engine.hooks.compile_hook import compile_submodules
    from mmdinomamba.models.backbones import MLLA, DinoVim, LinearViT
    from mmdinomamba.ops import (BACKENDS, resolve_backend, skip_kernels, ssd_scan,
                                 triton_available)
    from mmdinomamba.utils import dump_atomic

SIZES = ('tiny', 'small', 'base')
# The names of every mode: backbones by their mmpretrain-style names (ALIASES adds
# the short ones, 'mlla-t', 'vit-b', 'reg-b', ...). 'vit-base' is the baseline
# every ratio refers to. The DINO configs (DINO_CONFIGS) and the classification
# configs of the training loop (CLS_CONFIGS) are keyed by the same names.
MODELS = {
    'vit-base': dict(type='ViT', arch='base'),
    'swin-tiny': dict(type='Swin', arch='tiny'),
    **{f'dinovim-{a}': dict(type='DinoVim', arch=a) for a in SIZES},
    'dinomamba-reg-base': dict(type='DinoVim', arch='base', num_registers=12),
    'linearvit-base': dict(type='LinearViT', arch='base'),
    **{f'mlla-{a}': dict(type='MLLA', arch=a) for a in SIZES},
    # the block modules called one at a time (the stack runner DinoVim.loop_blocks):
    # the eager path before the one-call stack, the same numbers
    **{f'dinovim-{a}-loop': dict(type='DinoVim', arch=a, stack_runner='loop')
       for a in SIZES},
    # the RoPE table built in every mixer call (the code before one table per stage
    # and forward): the same numbers
    **{f'mlla-{a}-rope-per-call': dict(type='MLLA', arch=a, rope_tables='per-call')
       for a in SIZES},
    # the stages replayed from CUDA graphs, as CUDAGraphBlocksHook (which the shipped
    # MLLA configs hold) sets them: the same kernels and numbers
    **{f'mlla-{a}-graphed': dict(type='MLLA', arch=a, stage_graphs=True) for a in SIZES},
}
BASELINE = 'vit-base'


def _short(name: str) -> str:
    return re.sub(r'-(tiny|small|base)(?=-|$)', lambda m: '-' + m.group(1)[0], name)


ALIASES = {**{_short(name): name for name in MODELS if _short(name) != name},
           'reg-b': 'dinomamba-reg-base'}


def model_name(name: str) -> str:
    """The table's name for ``name``: a name of :data:`MODELS` or a short alias
    (``'mlla-t'`` -> ``'mlla-tiny'``); anything else comes back as it is (argparse's
    ``choices`` then names the valid ones)."""
    return ALIASES.get(name, name)


REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
# The repository's configs/, found from this file's place in the checkout
# (``dino-step --config-dir`` points elsewhere)
CONFIG_DIR = osp.join(REPO, 'configs', 'dino')
# The shipped DINO pretraining configs by name, as files of a config directory
DINO_CONFIGS = {
    name: f'dino_{name}-p16_4xb48-amp-100e_in1k.py'
    for name in ('dinovim-tiny', 'dinovim-small', 'dinovim-base', 'dinomamba-reg-base',
                 'linearvit-base', 'vit-base')
}
DINO_BASELINE = 'vit-base'
# ImageNet classification configs by name (the training loop's ``--task cls``):
# ours, and mmpretrain's own for the baselines (``pkg::path``, read from the
# installed package)
CLS_CONFIGS = {
    'vit-base': 'mmpretrain::vision_transformer/vit-base-p16_64xb64_in1k.py',
    'swin-tiny': 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py',
    **{f'mlla-{a}': osp.join(REPO, 'configs', 'mlla', f'mlla-{a}_32xb128-300e_in1k.py')
       for a in SIZES},
}
# --amp: the torch dtype's name (None: no autocast)
AMP_DTYPES = {'bf16': 'bfloat16', 'fp16': 'float16', 'none': None}
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


def host_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> List[float]:
    """Milliseconds the host takes to issue one call of ``fn``, per repeat.

    The device is synchronised before each call and after it, not in between: the
    figure is the time until ``fn`` returns, while the GPU may still be running
    what it issued. It is the host's cost of a step only when ``fn`` itself never
    waits for the device (no ``.item()``, no loss-scaler check) and the GPU keeps
    up; :func:`run_dino_steps` measures the host cost of steps that do wait by
    running them on two images instead (then the GPU waits for the host).
    """
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        synchronize(device)
    return times


def launches_per_call(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """GPU kernels one call of ``fn`` launches (``torch.profiler``; None on a CPU).

    Copies and memsets are not counted; every kernel is, PyTorch's and Triton's.
    """
    if device.type != 'cuda':
        return None
    from torch.profiler import ProfilerActivity, profile
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(('Memcpy', 'Memset'))]
    return len(kernels)


def python_calls_per_call(fn: Callable[[], object]) -> int:
    """Python function calls (built-ins included) one call of ``fn`` makes, as
    ``cProfile`` counts them, ``fn`` itself and the profiler's ``disable`` excluded.

    The host's work per step in a unit that does not depend on the machine: the
    hosts of a shared GPU box vary by 20-40 % in time between processes
    (README.md, "The host's drift"), which hides a cut of a tenth in the host's
    work; the count
    does not move. It does not see the work inside C++ (the dispatcher, the
    autograd engine); :func:`launches_per_call` counts the kernels.
    """
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    return pstats.Stats(prof).total_calls - 2  # fn, and the profiler's disable


def operators_per_call(fn: Callable[[], object]) -> int:
    """Torch operators one call of ``fn`` issues from Python or the autograd
    engine: the ``aten::`` events of ``torch.profiler`` (CPU activity) that no other
    ``aten::`` event encloses (``F.linear`` is one operator, not its ``t`` and
    ``mm`` inside).

    Each such operator goes through the dispatcher and costs the host
    microseconds, and an eager step's host time follows their number (with the
    kernel launches) more than the number of Python calls (README.md, host mode).
    Like :func:`python_calls_per_call` it does not depend on the
    machine's speed; Triton launches are not operators (:func:`launches_per_call`
    counts them).
    """
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()

    def top_level(event) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith('aten::'):
                return False
            parent = parent.cpu_parent
        return True

    return sum(1 for e in prof.events() if e.name.startswith('aten::') and top_level(e))


def _peak_gib(device: torch.device) -> Optional[float]:
    if device.type != 'cuda':
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def _peak_reserved_gib(device: torch.device) -> Optional[float]:
    """The caching allocator's peak reservation: with CUDA graphs, their private
    pools included, whoever holds them."""
    if device.type != 'cuda':
        return None
    return torch.cuda.max_memory_reserved(device) / 2**30


def _reset_peak(device: torch.device):
    """Forget the peaks so far, and hand back the cache: a previous model's CUDA
    graphs (kept alive by reference cycles until a collection) with it."""
    if device.type == 'cuda':
        gc.collect()
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


def build_swin(img_size: int, **cfg) -> torch.nn.Module:
    """mmpretrain's ``SwinTransformer`` (the hierarchical baseline; ``arch`` as
    mmpretrain's, 'tiny' = Swin-T), its last stage's map as output."""
    from mmpretrain.models import SwinTransformer
    model = SwinTransformer(img_size=img_size, **cfg)
    model.baseline_source = 'mmpretrain.SwinTransformer'
    return model


def build_official_mlla(path: str, arch: str, img_size: int) -> torch.nn.Module:
    """The official MLLA (LeapLabTHU/MLLA ``models/mlla.py``, read from ``path``
    as it is: nothing is fetched) in the ``arch`` of ours, without its classifier
    (``num_classes=0``: its forward is the final-normed, pooled features)."""
    import importlib.util
    if not osp.isfile(path):
        raise FileNotFoundError(f'benchmark: --official-mlla {path!r} is not a file; '
                                "give the path of the official code's models/mlla.py")
    spec = importlib.util.spec_from_file_location('official_mlla', path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:  # the official code needs timm
        raise RuntimeError(f'benchmark: the official MLLA at {path} does not import '
                           f'({e}); it needs timm') from e
    if not hasattr(module, 'MLLA'):
        raise ValueError(f'benchmark: {path} defines no MLLA class; is it the '
                         "official models/mlla.py?")
    a = MLLA.arch_zoo[arch]
    model = module.MLLA(img_size=img_size, num_classes=0, embed_dim=a['embed_dims'],
                        depths=a['depths'], num_heads=a['num_heads'],
                        mlp_ratio=a['mlp_ratio'], drop_path_rate=DROP_PATH_RATE)
    model.baseline_source = f'official MLLA ({osp.basename(path)})'
    return model


MODEL_TYPES = ('DinoVim', 'LinearViT', 'MLLA', 'OfficialMLLA', 'Swin', 'ViT')


def build_model(spec: dict, img_size: int) -> torch.nn.Module:
    """A backbone from a :data:`MODELS`-style spec, sized for ``img_size``."""
    cfg = dict(spec)
    kind = cfg.pop('type')
    if kind == 'ViT':
        return build_vit_b(img_size)
    if kind == 'OfficialMLLA':
        return build_official_mlla(cfg['path'], cfg['arch'], img_size)
    if kind not in MODEL_TYPES:
        raise ValueError(f'benchmark: unknown model type {kind!r}; choose one of '
                         f'{MODEL_TYPES}')
    runner = cfg.pop('stack_runner', None)
    rope_tables = cfg.pop('rope_tables', None)
    stage_graphs = cfg.pop('stage_graphs', False)
    cfg.setdefault('drop_path_rate', DROP_PATH_RATE)
    if kind == 'Swin':
        return build_swin(img_size, **cfg)
    model = dict(DinoVim=DinoVim, LinearViT=LinearViT, MLLA=MLLA)[kind](
        img_size=img_size, **cfg)
    set_stack_runner(model, runner)
    set_rope_tables(model, rope_tables)
    if stage_graphs:
        graphed_blocks.graph_blocks(model)
    return model


def set_rope_tables(model: torch.nn.Module, how: Optional[str]) -> None:
    """Where an MLLA's mixers get their RoPE table: None keeps the model's own
    way (one table per stage and forward, shared by the stage's blocks:
    :meth:`~mmdinomamba.models.backbones.mlla.MLLAStage.rope_table`);
    'per-call' has every mixer call build its own (the slow twin: the code
    before the shared table, the same numbers)."""
    if how not in (None, 'per-call'):
        raise ValueError(f"benchmark: rope_tables must be None or 'per-call', "
                         f'got {how!r}')
    if how == 'per-call':
        for stage in model.layers:
            stage.rope_table = lambda hw, like: None


def set_stack_runner(model: torch.nn.Module, runner: Optional[str]) -> None:
    """Set the blocks' runner of a DinoVim by name: None keeps its own (one call of
    :func:`mmdinomamba.ops.run_blocks`); 'loop' calls the block modules one at a
    time (:meth:`DinoVim.loop_blocks`: the same numbers, the eager path before the
    one-call stack)."""
    if runner not in (None, 'loop'):
        raise ValueError(f"benchmark: stack_runner must be None or 'loop', "
                         f'got {runner!r}')
    if runner == 'loop':
        model.stack_runner = model.loop_blocks


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


COMPILE_SCOPES = ('model', 'blocks')


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


# per step kind: the key of its time, and the figures that come from the same round
_MODEL_TIMED = {f'{kind}_ms': (f'{kind}_ms_all', f'{kind}_img_s', f'{kind}_peak_gib')
                for kind in ('infer', 'train', 'infer_graph', 'train_graph')}
_DINO_TIMED = {'s_iter': ('ms_all', 'img_s', 'peak_gib', 'reserved_gib',
                          'steady_reserved_gib')}
_HOST_TIMED = {'host_ms': ('host_ms_all', )}


def best_of_rounds(rows: List[dict], timed: Dict[str, Sequence[str]] = _MODEL_TIMED,
                   lowest: Sequence[str] = ('infer_host_ms', 'train_host_ms')) -> dict:
    """One row from the rows of one (model, size, batch) in several rounds.

    Per timed figure (a key of ``timed``: the ``models`` mode's ``<kind>_ms``, the
    ``dino-step`` mode's ``s_iter``, the ``host`` mode's ``host_ms``) the round with
    the fastest step gives it and the figures listed with it (img/s, peak memory);
    each ``lowest`` figure (the host times) is the lowest of any round. Slow phases of a shared host only ever
    add time, so the best round is the measurement of the step itself.
    ``<figure>_rounds`` keeps every round's value; counts (launches, Python calls,
    operators) do not depend on the round and come from the first. A pair that
    failed in any round keeps that round's ``error``.
    """
    failed = [r for r in rows if 'error' in r]
    if failed or len(rows) == 1:
        return dict(failed[0] if failed else rows[0])
    best = dict(rows[0])
    for key, companions in timed.items():
        measured = [r for r in rows if key in r]
        if not measured:
            continue
        fastest = min(measured, key=lambda r: r[key])
        for k in (key, *companions):
            if k in fastest:
                best[k] = fastest[k]
        best[f'{key}_rounds'] = [r[key] for r in measured]
    for key in lowest:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            best[key], best[f'{key}_rounds'] = min(values), values
    best['rounds'] = len(rows)
    return best


def in_rounds(measure_round: Callable[[], List[dict]], rounds: int,
              timed: Dict[str, Sequence[str]] = _MODEL_TIMED,
              lowest: Sequence[str] = ('infer_host_ms', 'train_host_ms')) -> List[dict]:
    """``measure_round()`` (one row per measured item, the items taking turns)
    ``rounds`` times, merged item by item by :func:`best_of_rounds`."""
    if rounds < 1:
        raise ValueError(f'benchmark: rounds must be >= 1, got {rounds}')
    per_round = [measure_round() for _ in range(rounds)]
    return [best_of_rounds(list(same), timed, lowest) for same in zip(*per_round)]


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


# --------------------------------------------------------------------------- #
# Host mode: the fused path's host work, counted and timed on a CPU
# --------------------------------------------------------------------------- #
LAUNCHES = ('fast', 'triton')


@contextlib.contextmanager
def tritons_own_launches(dry) -> Iterator[None]:
    """Inside a dry run (:func:`mmdinomamba.ops.skip_kernels`), launch the kernels
    through Triton's own path (``kernel[grid](...)``: binding, specialisation, cache
    key, launch metadata) instead of the fast launcher
    (``mmdinomamba/ops/triton/launch.py``), on any machine.

    Through Triton's extension points: its active driver is a stand-in (device 0,
    stream 0, an sm_90 target), and where Triton would compile, its
    ``jit_cache_hook`` puts a stand-in kernel in the cache that counts its launches
    into ``dry.launches`` (the first call of each specialisation compiles nothing
    and launches nothing); the stand-ins leave the caches at the end. The fast
    launcher is off meanwhile (``MMDINOMAMBA_TRITON_FAST_LAUNCH=0``)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from mmdinomamba.ops.triton import launch

    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget('cuda', 90, 32)

    class Kernel:
        function = packed_metadata = None

        def launch_metadata(self, grid, stream, *args):
            return None

        def run(self, *args):
            dry.launches += 1

    installed = []  # (the kernel cache, the key) of every stand-in

    def compile_hook(*args, **kwargs) -> bool:
        cache = kwargs['fn'].jit_function.device_caches[0][0]
        cache[kwargs['key']] = Kernel()
        installed.append((cache, kwargs['key']))
        return True  # compiled: nothing left to do

    env = os.environ.get('MMDINOMAMBA_TRITON_FAST_LAUNCH')
    hook = knobs.runtime.jit_cache_hook
    active = driver._active  # None until Triton first asks for a driver (no GPU: none)
    os.environ['MMDINOMAMBA_TRITON_FAST_LAUNCH'] = '0'
    launch.reread_environment()
    driver.set_active(Driver())
    knobs.runtime.jit_cache_hook = compile_hook
    try:
        yield
    finally:
        for cache, key in installed:
            cache.pop(key, None)
        knobs.runtime.jit_cache_hook = hook
        driver.set_active(active)
        if env is None:
            os.environ.pop('MMDINOMAMBA_TRITON_FAST_LAUNCH')
        else:
            os.environ['MMDINOMAMBA_TRITON_FAST_LAUNCH'] = env
        launch.reread_environment()


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
    launcher) and/or 'triton' (Triton's own path, :func:`tritons_own_launches`).
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
        return (tritons_own_launches(dry) if launch == 'triton'
                else contextlib.nullcontext())

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


# --------------------------------------------------------------------------- #
# DINO-step mode
# --------------------------------------------------------------------------- #
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
    :func:`run_models`, the configs take turns and each keeps its best round."""
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


# --------------------------------------------------------------------------- #
# Loop mode: tools/train.py as users run it, on synthetic ImageNet-layout data
# --------------------------------------------------------------------------- #
TASKS = ('cls', 'dino')
COMPILED = '+compile'  # a model name's suffix: compiled (CompileModulesHook)
# what CompileModulesHook compiles, per task: the backbones
COMPILE_MODULES = dict(cls=['backbone'], dino=['backbone', 'teacher.backbone'])
MAKE_DATA = osp.join(REPO, 'benchmarks', 'make_synthetic_imagenet.py')
TRAIN = osp.join(REPO, 'tools', 'train.py')
# tools/train.py's mixed-precision flags per --amp
LOOP_AMP_FLAGS = {None: [], 'bf16': ['--amp', '--amp-dtype', 'bfloat16'],
                  'fp16': ['--amp']}


def task_configs(task: str, config_dir: str = CONFIG_DIR) -> Dict[str, str]:
    """The loop's configs by model name: ``'dino'`` the shipped DINO pretraining
    configs (files of ``config_dir``), ``'cls'`` the ImageNet classification
    configs (:data:`CLS_CONFIGS`)."""
    if task == 'dino':
        return {name: osp.join(config_dir, f) for name, f in DINO_CONFIGS.items()}
    if task == 'cls':
        return dict(CLS_CONFIGS)
    raise ValueError(f'benchmark loop: task must be one of {TASKS}, got {task!r}')


def load_named_config(path: str):
    """A config from a file, or ``pkg::path`` from an installed OpenMMLab
    package's own configs (as ``_base_`` reads them)."""
    from mmengine.config import Config
    if '::' in path:
        from mmengine.hub import get_config
        return get_config(path)
    return Config.fromfile(path)


def loop_config(config: str, task: str, root: str, iters: int,
                batch: Optional[int] = None, size: Optional[int] = None,
                workers: int = 14, log_interval: int = 10,
                compile_mode: Optional[str] = None):
    """The config a timed run trains with: ``config`` as shipped, on the
    synthetic data of ``root``, for one epoch of exactly ``iters`` iterations.

    Changed: the data root, the first ``batch * iters`` images
    (``dataset.indices``), ``batch`` (None keeps the config's), the loader's
    workers, one epoch, the logging interval, no checkpoints; parameter
    schedulers that begin after the first epoch are dropped (they never act in a
    one-epoch run, and mmengine refuses a scheduler that begins after the run's
    end). ``size`` (classification only): the training crop
    (``RandomResizedCrop``) and the backbone's nominal ``img_size``.
    ``compile_mode``: the task's backbones compiled by
    :class:`~mmdinomamba.engine.hooks.CompileModulesHook` (``dynamic=False``), as
    the DINO ``-compile`` configs do.

    Returns:
        tuple: (the config, images per iteration).
    """
    if iters < 1:
        raise ValueError(f'benchmark loop: iters must be >= 1, got {iters}')
    cfg = load_named_config(config)
    loader = cfg.train_dataloader
    batch = batch or loader.batch_size
    loader.batch_size = batch
    loader.num_workers = workers
    loader.persistent_workers = workers > 0
    loader.dataset.data_root = root
    loader.dataset.indices = batch * iters
    cfg.train_cfg.max_epochs = 1
    schedulers = cfg.get('param_scheduler') or []
    schedulers = [schedulers] if isinstance(schedulers, dict) else schedulers
    cfg.param_scheduler = [
        s for s in schedulers
        if s.get('begin', 0) < (1 if s.get('by_epoch', True) else iters)]
    cfg.default_hooks.logger.interval = log_interval
    cfg.default_hooks.checkpoint.interval = iters + 1
    cfg.default_hooks.checkpoint.save_last = False
    if size is not None:
        if task != 'cls':
            raise ValueError('benchmark loop: --size sets a classification crop; the '
                             "DINO configs' crops are their own (leave --size out)")
        crops = [t for t in loader.dataset.pipeline if t['type'] == 'RandomResizedCrop']
        if len(crops) != 1:
            raise ValueError(f'benchmark loop: --size needs one RandomResizedCrop in '
                             f"{config}'s training pipeline, found {len(crops)}")
        crops[0]['scale'] = size
        if 'img_size' in cfg.model.backbone:
            cfg.model.backbone.img_size = size
    if compile_mode:
        cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [
            dict(type='CompileModulesHook', modules=COMPILE_MODULES[task],
                 mode=compile_mode, dynamic=False)]
    return cfg, batch


def read_train_log(text: str) -> Dict[str, object]:
    """Seconds per iteration, data time and peak memory from mmengine's log.

    mmengine logs, every ``interval`` iterations, the mean ``time`` and
    ``data_time`` over the window and (CUDA) ``memory``, the peak allocated MiB
    since the last log. The first window holds the warm-up (and any
    compilation); s/iter is the mean of the others, the peak the highest of all.

    Returns:
        dict: ``s_iter``, ``data_time`` (means over the windows after the first),
        ``windows`` (every window's time), ``peak_gib`` (None without CUDA); or
        ``error`` when fewer than two windows were logged.
    """
    times = [float(t) for t in re.findall(r'\btime: ([0-9.]+)', text)]
    data = [float(t) for t in re.findall(r'\bdata_time: ([0-9.]+)', text)]
    memory = [int(m) for m in re.findall(r'\bmemory: ([0-9]+)', text)]
    if len(times) < 2:
        return dict(windows=times, error=f'{len(times)} logged window(s): s/iter '
                    'needs two (the first holds the warm-up)')
    return dict(s_iter=statistics.mean(times[1:]), windows=times,
                data_time=statistics.mean(data[1:]) if len(data) > 1 else None,
                peak_gib=max(memory) / 1024 if memory else None)


def synthetic_images(root: str, num_images: int) -> None:
    """At least ``num_images`` synthetic JPEGs under ``root`` (written by
    ``make_synthetic_imagenet.py`` unless its list already holds that many)."""
    listing = osp.join(root, 'meta', 'train.txt')
    if osp.isfile(listing):
        with open(listing) as f:
            if sum(1 for line in f if line.strip()) >= num_images:
                return
    subprocess.run([sys.executable, MAKE_DATA, root, str(num_images)], check=True)


def run_loop(names: Sequence[str], task: str, root: str, work_dir: str, iters: int,
             batch: Optional[int] = None, size: Optional[int] = None,
             workers: int = 14, log_interval: int = 10,
             compile_mode: str = 'default', amp: Optional[str] = None,
             baseline: Optional[str] = BASELINE, config_dir: str = CONFIG_DIR,
             on_row: Optional[Callable[[List[dict]], None]] = None) -> List[dict]:
    """Train each named model with ``tools/train.py`` for ``iters`` iterations,
    one process each, and read its log (:func:`read_train_log`).

    A name (of :func:`task_configs`) ending in ``+compile`` trains compiled
    (:func:`loop_config`'s ``compile_mode``). Each run's config is written to
    ``work_dir/<name>.py``, its output to ``work_dir/<name>.log``. ``amp``: None
    trains in the config's own precision, 'bf16' / 'fp16' add ``tools/train.py
    --amp`` (bf16: ``--amp-dtype bfloat16``). ``img_s_vs_baseline`` is the row's
    images/s over the baseline's: the baseline model with the row's ``+compile``
    if that ran, else the eager one; ``baseline`` (if not None) is measured first
    unless ``names`` name it (eager or compiled).

    Returns:
        list[dict]: per name, ``model``, ``config``, ``batch``, ``compile``,
        ``s_iter``, ``img_s``, ``data_time``, ``peak_gib``, ``windows``, ``log``
        (or ``error``) and the ratio.
    """
    if amp not in LOOP_AMP_FLAGS:
        raise ValueError(f'benchmark loop: amp must be one of {list(LOOP_AMP_FLAGS)}, '
                         f'got {amp!r}')
    if iters < 2 * log_interval:
        raise ValueError(f'benchmark loop: {iters} iterations give fewer than two '
                         f'logged windows of {log_interval}; s/iter needs two (the '
                         'first holds the warm-up)')
    configs = task_configs(task, config_dir)
    work_dir = osp.abspath(work_dir)
    names = [model_name(n[:-len(COMPILED)]) + COMPILED if n.endswith(COMPILED)
             else model_name(n) for n in names]
    if baseline is not None and not {baseline, baseline + COMPILED} & set(names):
        names = [baseline] + names
    unknown = sorted({n[:-len(COMPILED)] if n.endswith(COMPILED) else n
                      for n in names} - set(configs))
    if unknown:
        raise ValueError(f'benchmark loop: no {task} config for {unknown}; choose '
                         f'from {sorted(configs)} (a name may end in {COMPILED!r})')
    os.makedirs(work_dir, exist_ok=True)
    runs = []
    for name in names:
        compiled = name.endswith(COMPILED)
        config = configs[name[:-len(COMPILED)] if compiled else name]
        cfg, images = loop_config(config, task, osp.abspath(root), iters, batch, size,
                                  workers, log_interval,
                                  compile_mode if compiled else None)
        path = osp.join(work_dir, name.replace('+', '_') + '.py')
        cfg.dump(path)
        runs.append(dict(model=name, config=config, run_config=path, batch=images,
                         compile=compile_mode if compiled else None, task=task))
    synthetic_images(root, max(r['batch'] for r in runs) * iters)
    rows = []
    for row in runs:
        row['log'] = osp.join(work_dir, row['model'].replace('+', '_') + '.log')
        cmd = [sys.executable, TRAIN, row['run_config'], '--work-dir',
               osp.join(work_dir, row['model'].replace('+', '_')), '--no-validate',
               *LOOP_AMP_FLAGS[amp]]
        row['command'] = ' '.join(cmd)
        with open(row['log'], 'w') as log:
            done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        with open(row['log']) as log:
            text = log.read()
        row.update(read_train_log(text))
        if done.returncode:
            raised = re.findall(r'^(\w+(?:Error|Exception)\b.*)$', text, re.M)
            row['error'] = (f'tools/train.py exited with {done.returncode}'
                            + (f' ({raised[-1][:200]})' if raised else '')
                            + f"; see {row['log']}")
        if 'error' not in row:
            row['img_s'] = row['batch'] / row['s_iter']
        rows.append(row)
        print(format_loop_row(row), flush=True)
        if on_row is not None:
            on_row(rows)
    add_loop_ratios(rows, baseline)
    return rows


def add_loop_ratios(rows: List[dict], baseline: Optional[str]) -> None:
    """``img_s_vs_baseline`` and ``baseline`` (the row it refers to) for each row:
    the baseline with the row's ``+compile`` where it ran, else the eager one."""
    if baseline is None:
        return
    by_name = {r['model']: r for r in rows if r.get('img_s')}
    for r in rows:
        suffix = COMPILED if r['model'].endswith(COMPILED) else ''
        base = by_name.get(baseline + suffix) or by_name.get(baseline)
        if base is not None and r.get('img_s'):
            r['baseline'] = base['model']
            r['img_s_vs_baseline'] = r['img_s'] / base['img_s']


def format_loop_row(r: dict) -> str:
    if 'error' in r:
        return f"{r['model']:<24}  ERROR {r['error']}"
    return (f"{r['model']:<24} {r['batch']:>5} {r['s_iter']:8.3f} {r['img_s']:9.1f} "
            f"{_fmt(r.get('img_s_vs_baseline'), '6.2f'):>6} "
            f"{_fmt(r.get('peak_gib'), '8.2f'):>8} {_fmt(r.get('data_time'), '9.4f'):>9}"
            f"  {r.get('baseline', '-')}")


def format_loop_table(rows: List[dict]) -> str:
    head = (f"{'model':<24} {'batch':>5} {'s/iter':>8} {'img/s':>9} {'xBase':>6} "
            f"{'peakGiB':>8} {'dataTime':>9}  baseline")
    return '\n'.join([head, '-' * len(head)] + [format_loop_row(r) for r in rows])


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
                    return ssd_scan(**inputs, dt_softplus=True, backend=backend)

            leaves = {k: v.detach().requires_grad_(k in grad_names)
                      for k, v in inputs.items()}
            dy = torch.randn(batch, seqlen, nheads, headdim, generator=gen).to(device, dtype)

            def fwd_bwd():
                y = ssd_scan(**leaves, dt_softplus=True, backend=backend)
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
                  iters: int, host: bool = False) -> List[dict]:
    """Where one step's time goes, per kernel (CUDA) or per operator (CPU).

    Runs ``warmup`` steps, then profiles ``iters`` steps with ``torch.profiler``:
    on CUDA the device time of each kernel, on the CPU (or with ``host``, on any
    device) the host's self time of each operator and autograd function (an
    autograd function's self time is the Python it runs around its operators and
    kernel launches: what an eager step waits on when the host is the limit).
    The profiler's own overhead inflates host times; compare rows with each other,
    not with unprofiled timings. Returns rows ``name, ms_per_step,
    calls_per_step``, largest first.
    """
    from torch.profiler import ProfilerActivity, profile
    if step not in ('infer', 'train'):
        raise ValueError(f"benchmark: step must be 'infer' or 'train', got {step!r}")
    model = build_model(spec, img_size)
    model.to(device)  # mmpretrain's ViT returns None from .to()
    model.train(step == 'train')
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    fn = _steps(model, x, device, amp, graph=False)[step == 'train']
    for _ in range(warmup):
        fn()
    synchronize(device)
    cuda = device.type == 'cuda' and not host
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


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #
COMPILE_MODES = ['default', 'reduce-overhead', 'max-autotune',
                 'max-autotune-no-cudagraphs']


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device',
                        help='default: cuda when there is one, else cpu')
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES),
                        help='autocast dtype (kernel mode: input dtype); default bf16, '
                        "none in host mode (on a CPU, bf16 matrix products time the "
                        "CPU's bf16 arithmetic, not host work); loop mode: bf16 or "
                        "fp16 adds tools/train.py --amp, default the config's own "
                        'precision')
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--iters', type=int, default=3, help='steps per timed repeat')
    parser.add_argument('--out', help='write results as JSON here')
    sub = parser.add_subparsers(dest='mode', required=True)
    m = sub.add_parser('models', help='backbone throughput and memory')
    m.add_argument('--models', nargs='+', type=model_name, choices=sorted(MODELS),
                   metavar='MODEL', help=f'of {sorted(MODELS)} or a short alias '
                   "('mlla-t', 'vit-b', 'reg-b', ...)",
                   default=['dinovim-tiny', 'dinovim-small', 'dinovim-base',
                            'dinomamba-reg-base', 'linearvit-base'])
    m.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024])
    m.add_argument('--batch-sizes', nargs='+', type=int, default=[128, 16, 4],
                   help='one per size')
    m.add_argument('--modes', nargs='+', choices=['infer', 'train'],
                   default=['infer', 'train'])
    m.add_argument('--ssd-backend', default='auto', metavar='BACKEND',
                   help="DinoVim mixers' ssd_backend ('auto': fused Triton on CUDA)")
    m.add_argument('--baseline', type=model_name, choices=sorted(MODELS),
                   metavar='MODEL', default=BASELINE,
                   help='the model every ratio refers to, measured first (default: '
                   f'{BASELINE})')
    m.add_argument('--no-baseline', action='store_true',
                   help='skip the baseline (no ratios)')
    m.add_argument('--rounds', type=int, default=1,
                   help='measure every model this many times, taking turns, and keep '
                   "each one's best round (a shared host's speed drifts)")
    m.add_argument('--cuda-graph', action='store_true',
                   help='also time each step replayed from a CUDA graph (gInfer, gTrain)')
    m.add_argument('--compile', choices=COMPILE_MODES,
                   help='torch.compile every model (the baseline too) in this mode first')
    m.add_argument('--compile-scope', choices=COMPILE_SCOPES, default='model',
                   help="what --compile compiles: the whole 'model', or each of its "
                   "'blocks' on its own (regional: blocks of one shape share a graph, "
                   'so compiling takes a fraction of the time)')
    m.add_argument('--official-mlla', metavar='PATH',
                   help="the official MLLA's models/mlla.py (LeapLabTHU/MLLA, read "
                   'from PATH, never fetched): each mlla-* model of --models gets an '
                   "'-official' row of the same arch, measured in the same call")
    m.add_argument('--graph-blocks', action='store_true',
                   help="replay DinoVim's blocks from CUDA graphs in the eager steps "
                   '(what CUDAGraphBlocksHook does)')
    d = sub.add_parser('dino-step', help='the DINO training step of the shipped configs')
    d.add_argument('--models', nargs='+', type=model_name, choices=sorted(DINO_CONFIGS),
                   default=['dinovim-tiny', 'dinovim-small', 'dinovim-base'])
    d.add_argument('--host-batch', type=int, default=2,
                   help='images per view of the host-bound run (0: skip it)')
    d.add_argument('--no-baseline', action='store_true',
                   help=f'skip the {DINO_BASELINE} baseline (no ratios)')
    d.add_argument('--config-dir', default=CONFIG_DIR,
                   help='where the DINO configs are (default: this checkout\'s '
                   'configs/dino)')
    d.add_argument('--rounds', type=int, default=1,
                   help='measure every config this many times, taking turns, and keep '
                   "each one's best round")
    d.add_argument('--compile', choices=COMPILE_MODES,
                   help='torch.compile both backbones of each DINO model in this mode, '
                   'as CompileModulesHook does (the baseline only with '
                   '--compile-baseline)')
    d.add_argument('--compile-baseline', action='store_true',
                   help='compile the baseline too')
    blocks = d.add_mutually_exclusive_group()
    blocks.add_argument('--graph-blocks', action='store_const', const=True,
                        dest='graph_blocks', help="replay the backbones' blocks from "
                        'CUDA graphs, as CUDAGraphBlocksHook does (default: as each '
                        'config says; the shipped DinoVim configs hold that hook)')
    blocks.add_argument('--eager-blocks', action='store_const', const=False,
                        dest='graph_blocks', help='run the blocks eagerly, also where '
                        'the config holds CUDAGraphBlocksHook')
    h = sub.add_parser('host', help="the fused path's host work per eager training step, "
                       'on the CPU with the kernels skipped')
    h.add_argument('--models', nargs='+', type=model_name,
                   choices=sorted(n for n, m in MODELS.items()
                                  if m['type'] in ('DinoVim', 'MLLA')),
                   default=['dinovim-base', 'dinovim-base-loop'])
    h.add_argument('--baseline', type=model_name, default='dinovim-base-loop',
                   help="the row the others' ratios refer to (one of --models)")
    h.add_argument('--width', type=int, default=64,
                   help="a DinoVim's channels (the depth and layout are the model's "
                   'own; an MLLA keeps its widths)')
    h.add_argument('--batch', type=int, default=2)
    h.add_argument('--rounds', type=int, default=3,
                   help='the models take turns; each keeps its lowest median')
    h.add_argument('--launch', nargs='+', choices=LAUNCHES, default=['fast'],
                   help="how the kernels are launched: 'fast' (the package's launcher) "
                   "and/or 'triton' (Triton's own path); each model under each")
    k = sub.add_parser('kernel', help='the SSD op alone')
    k.add_argument('--backends', nargs='+', metavar='BACKEND',
                   default=['chunked', 'triton', 'mamba_ssm'],
                   help='SSD backends of mmdinomamba.ops.BACKENDS but auto '
                   '(default: chunked triton mamba_ssm)')
    k.add_argument('--batch', type=int, default=128)
    k.add_argument('--seqlen', type=int, default=198)
    k.add_argument('--nheads', type=int, default=24)
    k.add_argument('--headdim', type=int, default=64)
    k.add_argument('--dstate', type=int, default=64)
    k.add_argument('--ngroups', type=int, default=1)
    p = sub.add_parser('profile', help='time per kernel of one step of one model')
    p.add_argument('--model', type=model_name, choices=sorted(MODELS),
                   metavar='MODEL', default='dinovim-base')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--step', choices=['infer', 'train'], default='train')
    p.add_argument('--top', type=int, default=20, help='rows to print')
    p.add_argument('--host', action='store_true',
                   help="the host's self time per operator and autograd function "
                        '(on CUDA: instead of the time per kernel)')
    lp = sub.add_parser('loop', help='tools/train.py with the shipped configs on '
                        'synthetic ImageNet-layout data (s/iter from its log)')
    lp.add_argument('--task', choices=TASKS, default='cls',
                    help="'cls': the ImageNet classification configs; 'dino': the "
                    'DINO pretraining configs')
    lp.add_argument('--models', nargs='+', metavar='MODEL',
                    help=f"names of the task's configs (cls: {sorted(CLS_CONFIGS)}; "
                    f'dino: {sorted(DINO_CONFIGS)}; or short aliases), each '
                    f'optionally ending in {COMPILED!r} (its backbones compiled); '
                    'default: every model of the task')
    lp.add_argument('--train-iters', type=int, default=30,
                    help='iterations of the one epoch (a multiple of --log-interval)')
    lp.add_argument('--batch', type=int, help="images per iteration (default: the "
                    "config's)")
    lp.add_argument('--size', type=int, help='training crop of the classification '
                    "configs (default: the config's, 224)")
    lp.add_argument('--workers', type=int, default=14, help='data loader workers')
    lp.add_argument('--log-interval', type=int, default=10,
                    help='iterations per logged window')
    lp.add_argument('--compile-mode', choices=COMPILE_MODES, default='default',
                    help=f'torch.compile mode of the {COMPILED!r} models')
    lp.add_argument('--root', default='work_dirs/synthetic_imagenet',
                    help='the synthetic data (written when it holds too few images)')
    lp.add_argument('--work-dir', default='work_dirs/loop',
                    help="each run's config, log and work directory")
    lp.add_argument('--no-baseline', action='store_true',
                    help=f'no ratios (by default {BASELINE} is measured first, unless '
                    '--models names it, eager or compiled)')
    lp.add_argument('--config-dir', default=CONFIG_DIR,
                    help="where the DINO configs are (default: this checkout's "
                    'configs/dino)')
    args = parser.parse_args(argv)
    load_runtime()  # after parsing: --help and usage errors come at once
    backends = {'ssd_backend': [getattr(args, 'ssd_backend', 'auto')],
                'backends': [b for b in getattr(args, 'backends', None) or []]}
    for option, names in backends.items():
        allowed = BACKENDS if option == 'ssd_backend' else \
            tuple(b for b in BACKENDS if b != 'auto')
        for name in names:
            if name not in allowed:
                parser.error(f"argument --{option.replace('_', '-')}: invalid choice: "
                             f"{name!r} (choose from {', '.join(map(repr, allowed))})")
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.mode == 'loop':
        return main_loop(args)
    if args.amp is None:
        args.amp = 'none' if args.mode == 'host' else 'bf16'
    amp = getattr(torch, AMP_DTYPES[args.amp]) if AMP_DTYPES[args.amp] else None
    result = dict(mode=args.mode, environment=environment(device),
                  settings=dict(amp=args.amp, warmup=args.warmup, repeats=args.repeats,
                                iters=args.iters), command=' '.join(sys.argv))
    if args.mode == 'models':
        baseline = None if args.no_baseline else args.baseline
        specs = {}
        for name in ([baseline] if baseline else []) + args.models:  # baseline first
            spec = dict(MODELS[name])
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
    elif args.mode == 'dino-step':
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
    elif args.mode == 'host':
        result['settings'].update(models=args.models, width=args.width, batch=args.batch,
                                  rounds=args.rounds, launch=args.launch)
        specs = {name: MODELS[name] for name in args.models}
        baseline = args.baseline if args.baseline in specs else None
        rows = run_host(specs, baseline, args.rounds, args.launch, width=args.width,
                        batch=args.batch, warmup=args.warmup, repeats=args.repeats,
                        iters=args.iters, amp=amp)
        result['rows'] = rows
        print(format_host_table(rows, baseline))
    elif args.mode == 'profile':
        result['settings'].update(model=args.model, size=args.size, batch=args.batch,
                                  step=args.step, host=args.host)
        rows = profile_model(MODELS[args.model], args.size, args.batch, device, amp,
                             args.step, args.warmup, args.iters, host=args.host)
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


def partial_writer(result: dict, out: Optional[str]):
    """None without ``out``; else a callback that writes the rows measured so far
    (``partial: true``) to ``out``, so that a run cut short keeps them."""
    if not out:
        return None
    return lambda rows: dump_atomic(dict(result, rows=list(rows), partial=True), out)


def main_loop(args) -> dict:
    """The ``loop`` mode's part of :func:`main`."""
    if args.amp == 'none':
        raise ValueError('benchmark loop: --amp none cannot take AMP out of a config; '
                         "leave --amp out for the config's own precision")
    configs = task_configs(args.task, args.config_dir)
    names = args.models or [n for n in configs if n != BASELINE]
    result = dict(mode='loop', environment=environment(torch.device(args.device)),
                  settings=dict(task=args.task, models=names, amp=args.amp,
                                train_iters=args.train_iters, batch=args.batch,
                                size=args.size, workers=args.workers,
                                log_interval=args.log_interval,
                                compile_mode=args.compile_mode),
                  command=' '.join(sys.argv))
    rows = run_loop(names, args.task, args.root, args.work_dir, args.train_iters,
                    args.batch, args.size, args.workers, args.log_interval,
                    args.compile_mode, args.amp,
                    None if args.no_baseline else BASELINE, args.config_dir,
                    on_row=partial_writer(result, args.out))
    result['rows'] = rows
    print(format_loop_table(rows))
    if args.out:
        dump_atomic(result, args.out)
    return result


if __name__ == '__main__':
    main()
