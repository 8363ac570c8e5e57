"""What every benchmark mode shares: timing, counting, memory, the models, the output.

* timing and counting: :func:`time_ms`, :func:`host_ms`, :func:`launches_per_call`,
  :func:`python_calls_per_call`, :func:`operators_per_call`; rounds that take
  turns (:func:`in_rounds`, :func:`best_of_rounds`);
* the models: names from :mod:`mmdinomamba.zoo` (its backbones, their
  :data:`~benchmarks.names.VARIANTS`) and the external baselines the zoo lacks
  (:data:`BASELINES`), built by :func:`build_model`;
* the output: :func:`environment` (the machine and the code: :func:`code_version`,
  the commit and a dirty flag) and :func:`write_result` (JSON, or CSV rows that
  carry ``date``, ``card``, ``code`` and ``command``), written atomically.

Every timing is the median over ``repeats`` timed runs of ``iters`` steps each,
after ``warmup`` untimed steps, with the device synchronised around each run.
"""
from __future__ import annotations  # annotations name torch types: not evaluated

import csv
import datetime
import gc
import io
import os.path as osp
import platform
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from mmdinomamba import zoo
from mmdinomamba.engine import graphed_blocks
from mmdinomamba.models.backbones import MLLA, DinoVim, LinearViT
from mmdinomamba.ops import triton_available
from mmdinomamba.utils import dump_atomic, write_text_atomic

from .names import DROP_PATH_RATE, REPO, VARIANTS

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
    up; the ``dino-step`` mode
    (:func:`benchmarks.modes.dino_step.run_dino_steps`) measures the host cost of
    steps that do wait by running them on two images instead (then the GPU waits
    for the host).
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
# Model names: the zoo's, their variants, the external baselines
# --------------------------------------------------------------------------- #
# The baselines the zoo lacks (it holds the models with shipped configs): name ->
# (spec, short aliases). 'vit-base' is the zoo's (type VisionTransformer), built by
# build_vit_b: mmpretrain's when it imports, else timm's.
BASELINES = {'swin-tiny': (dict(type='Swin', arch='tiny'), ('swin-t', ))}
MODEL_TYPES = ('DinoVim', 'LinearViT', 'MLLA', 'OfficialMLLA', 'Swin', 'ViT')
_TABLE: Dict[str, dict] = {}


def model_table() -> Dict[str, dict]:
    """Every name a mode takes -> its spec (one dict, built once): the zoo's
    backbones, their :data:`~benchmarks.names.VARIANTS` (``mlla-tiny-graphed``,
    ``dinovim-base-loop``, ...) and :data:`BASELINES`."""
    if not _TABLE:
        entries = [(name, cfg) for name, (cfg, _, _) in zoo.BACKBONES.items()]
        entries += [(name, spec) for name, (spec, _) in BASELINES.items()]
        for name, cfg in entries:
            spec = dict(cfg)
            if spec['type'] == 'VisionTransformer':
                spec['type'] = 'ViT'
            _TABLE[name] = spec
            if set(spec) == {'type', 'arch'}:  # the plain presets
                for suffix, extra in VARIANTS.get(spec['type'], {}).items():
                    _TABLE[name + suffix] = dict(spec, **extra)
    return _TABLE


def model_name(name: str) -> str:
    """The table's name for ``name``: a name of :func:`model_table`, or one with
    a zoo alias or a baseline's alias in place of the zoo name (``'mlla-t'`` ->
    ``'mlla-tiny'``, ``'dinovim-b-loop'`` -> ``'dinovim-base-loop'``); anything
    else comes back as it is (the caller names the valid ones)."""
    aliases = {**zoo.ALIASES, **{a: n for n, (_, al) in BASELINES.items() for a in al}}
    text = name.strip().lower()
    for suffix in ('', *sorted({s for v in VARIANTS.values() for s in v})):
        if suffix and not text.endswith(suffix):
            continue
        base = text[:len(text) - len(suffix)]
        if base in aliases and aliases[base] + suffix in model_table():
            return aliases[base] + suffix
    return name

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


def build_model(spec: dict, img_size: int) -> torch.nn.Module:
    """A backbone from a :func:`model_table`-style spec, sized for ``img_size``."""
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
    'per-call' has every mixer call build its own (the slow twin, the same
    numbers: each stage's ``share_rope_table`` switch off)."""
    if how not in (None, 'per-call'):
        raise ValueError(f"benchmark: rope_tables must be None or 'per-call', "
                         f'got {how!r}')
    for stage in model.layers:
        stage.share_rope_table = how != 'per-call'


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
    each ``lowest`` figure (the host times) is the lowest of any round. Slow
    phases of a shared host only ever add time, so the best round is the
    measurement of the step itself.
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



def _fmt(v, spec: str) -> str:
    return '-' if v is None else format(v, spec)




# --------------------------------------------------------------------------- #
# Output
# --------------------------------------------------------------------------- #
def code_version(repo: str = REPO) -> str:
    """The code measured: the checkout's commit (short hash), with ``+dirty`` when
    tracked files differ from it (``git status --porcelain``, untracked files
    ignored); ``'unknown'`` outside a git checkout or without git."""
    def git(*args: str) -> str:
        return subprocess.run(['git', '-C', repo, *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()

    try:
        commit = git('rev-parse', '--short', 'HEAD')
        dirty = git('status', '--porcelain', '--untracked-files=no')
    except (OSError, subprocess.SubprocessError):
        return 'unknown'
    return commit + ('+dirty' if dirty else '') if commit else 'unknown'


def environment(device: torch.device) -> dict:
    env = dict(date=datetime.date.today().isoformat(), code=code_version(),
               torch=torch.__version__, python=platform.python_version(),
               device=str(device), triton_available=triton_available())
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


# the columns every CSV row starts with, as in benchmarks/results/*.csv
CSV_LEAD = ('date', 'card', 'code', 'command')


def csv_text(result: dict) -> str:
    """``result``'s rows as CSV: :data:`CSV_LEAD` from its environment and command,
    then every figure of the rows (the union of their keys, in order of first
    appearance; a list of runs is joined by spaces)."""
    env = result['environment']
    lead = dict(date=env['date'], card=env.get('gpu') or env.get('cpu', env['device']),
                code=env['code'], command=result['command'])
    keys: List[str] = []
    for row in result['rows']:
        keys += [k for k in row if k not in keys and k not in CSV_LEAD]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=[*CSV_LEAD, *keys], lineterminator='\n')
    writer.writeheader()
    for row in result['rows']:
        writer.writerow({**lead, **{k: ' '.join(map(str, v)) if isinstance(v, list)
                                    else v for k, v in row.items()}})
    return text.getvalue()


def write_result(result: dict, out: str) -> None:
    """Write ``result`` to ``out``, atomically: CSV rows (:func:`csv_text`) when
    ``out`` ends in ``.csv``, else the whole result as JSON."""
    if out.endswith('.csv'):
        write_text_atomic(out, csv_text(result))
    else:
        dump_atomic(result, out)


def partial_writer(result: dict, out: Optional[str]):
    """None without ``out``; else a callback that writes the rows measured so far
    (``partial: true``) to ``out``, so that a run cut short keeps them."""
    if not out:
        return None
    return lambda rows: write_result(dict(result, rows=list(rows), partial=True), out)
