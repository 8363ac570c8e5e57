"""The DINO recipe on toy data, end to end: one pipeline, three presets.

    python tools/run_demo.py         # preset 'demo' (make demo), on a CPU
    python tools/run_comparison.py   # preset 'compare', the mixers side by side
    python tools/run_comparison.py --preset seq256   # the same at 256 tokens

(both aliases of ``tools/run_recipe.py``, which parses the command line and
hands :func:`run_recipe` the train command).

Steps, each announced when it starts; the libraries' output goes to
``<work-dir>/<step>.log`` (a training run) or ``<work-dir>/recipe.log``:

1. the rich toy dataset (:func:`mmdinomamba.datasets.make_toy_dataset`; nothing
   to do when it is there);
2. DINO pretraining of each model through the train command the caller hands in
   (the tools hand in their ``train.py``), on its config with the data root, the
   run length and ``--cfg-options`` merged (written to ``<work-dir>/configs/``
   first): the mean loss of each epoch is printed as the epoch ends;
3. the teacher backbone of the run's last checkpoint, and of ``init.pth``, the
   weights the run started from (``InitialWeightsHook``): "random init" below;
4. a linear probe on the teacher (and, in 'compare', on the init);
5. the teacher against its own random init on the held-out images
   (:func:`~mmdinomamba.studies.comparison.measures.compare_models`): k-NN top-1, the
   Binary-AUC of the attention and the cosine map, each with its bootstrap
   interval, and the teacher's paired gain; the report and its figures in
   ``<work-dir>/report/`` or ``--out`` (``activation_maps.png``: the teacher's
   and the init's attention maps of the same images, side by side), and a
   verdict.

The models of a preset are rows of a table (:data:`COMPARE_MODELS`,
:data:`SEQ256_MODELS`): a DINO config and its linear-probe config. The 'demo'
preset fails (exit status 1) unless every loss fell and the teacher's mean beats
its init's on both k-NN and the attention map's Binary-AUC over the held-out
images.
"""
import argparse
import logging
import logging.handlers
import math
import os
import os.path as osp
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mmengine.config import Config
from mmengine.logging import MMLogger

from mmdinomamba.engine import (amp_twin, epoch_checkpoints, epoch_losses,
                                latest_checkpoint, logged_runs, parse_cfg_options,
                                read_scalars, set_data_root, set_num_workers,
                                set_run_length)
from mmdinomamba.utils import write_atomic
from .presets import (COMPARE_MODELS, DEMO_MODELS, PRESETS, SEQ256_MODELS,
                      Preset, RecipeModel)

__all__ = ['COMPARE_MODELS', 'DEMO_MODELS', 'PRESETS', 'Preset', 'RecipeError',
           'RecipeModel', 'SEQ256_MODELS', 'TrainingRun', 'dino_config',
           'ended_epochs', 'loss_fell', 'probe_config', 'run_recipe',
           'side_by_side', 'verdict', 'watch', 'warmup_epochs']


class RecipeError(RuntimeError):
    """A step of the recipe failed; the message says which and why."""


# --------------------------------------------------------------------------- #
# The configs of each run
# --------------------------------------------------------------------------- #
def warmup_epochs(epochs: int) -> int:
    """The warm-up of a ``--epochs`` run: a tenth (at least one epoch), none for a
    one-epoch run."""
    return max(1, epochs // 10) if epochs > 1 else 0


def _finish_config(cfg: Config, options: Sequence[str], device: str,
                   num_workers: Optional[int]) -> Config:
    cfg.merge_from_dict(parse_cfg_options(options))
    if num_workers is not None:
        set_num_workers(cfg, num_workers)
    if device == 'cpu' and 'optim_wrapper' in cfg:
        # AMP needs a GPU: the same wrapper in float32
        cfg.optim_wrapper.type = amp_twin(cfg.optim_wrapper.get('type', 'OptimWrapper'),
                                          amp=False)
    return cfg


def dino_config(path: str, data_root: str, epochs: Optional[int] = None,
                options: Sequence[str] = (), device: str = 'cpu',
                num_workers: Optional[int] = None) -> Config:
    """A DINO run's config: ``path`` on ``data_root`` (every dataset, the k-NN
    monitor's too), ``epochs`` long (None: as configured; warm-up
    :func:`warmup_epochs`), then ``options`` (``KEY=VALUE``, as
    ``--cfg-options``), then the data workers; on the CPU its optimizer wrapper
    in float32."""
    cfg = Config.fromfile(path)
    set_data_root(cfg, data_root)
    if epochs is not None:
        set_run_length(cfg, epochs, warmup_epochs(epochs))
    return _finish_config(cfg, options, device, num_workers)


def probe_config(path: str, data_root: str, backbone: Optional[str],
                 epochs: Optional[int] = None, options: Sequence[str] = (),
                 device: str = 'cpu', num_workers: Optional[int] = None) -> Config:
    """A linear probe's config: ``path`` on ``data_root`` and its
    ``classes.txt``, its frozen backbone from ``backbone`` (a file of
    :func:`~mmdinomamba.models.checkpoint.extract_dino_backbone`; None: the
    config's own initialisation), ``epochs`` long (None: as configured), then
    ``options``, then the data workers."""
    cfg = Config.fromfile(path)
    set_data_root(cfg, data_root)
    if backbone is None:
        cfg.model.backbone.init_cfg = None
    else:
        cfg.model.backbone.init_cfg.update(checkpoint=backbone, prefix=None)
    if epochs is not None:
        set_run_length(cfg, epochs)
    return _finish_config(cfg, options, device, num_workers)


def write_config(cfg: Config, path: str) -> str:
    """``cfg`` dumped to ``path`` (atomically); ``path``."""
    write_atomic(path, cfg.dump)
    return path


# --------------------------------------------------------------------------- #
# Training runs, watched
# --------------------------------------------------------------------------- #
def ended_epochs(records: List[dict], after: int,
                 finished: bool) -> List[Tuple[int, float]]:
    """(epoch, mean loss) of each epoch after ``after`` that has ended: a later
    epoch has logged, or the run has ``finished``."""
    losses = epoch_losses(records)
    last = max((r['epoch'] for r in records if 'epoch' in r), default=0)
    return [(e, v) for e, v in losses.items() if e > after and (e < last or finished)]


class TrainingRun:
    """``TRAIN_COMMAND CONFIG --work-dir WORK_DIR`` in a process of its own, its
    output in ``log``.

    Args:
        label (str): its name on the screen.
        root (str): the repository root (the cwd, put on ``PYTHONPATH``).
        train_command (Sequence[str]): the command that trains one config, taking
            ``CONFIG --work-dir WORK_DIR`` (e.g. ``[sys.executable,
            '<root>/<train script>']``); the caller names it, the package does not.
        config (str): the config file.
        work_dir (str): the run's work dir.
        log (str): the file that gets the process's output.
        device (str): 'cpu' hides the GPUs from the process.
    """

    def __init__(self, label: str, root: str, train_command: Sequence[str],
                 config: str, work_dir: str, log: str, device: str = 'cpu'):
        self.label, self.work_dir, self.log = label, work_dir, log
        self.max_epochs = Config.fromfile(config).train_cfg.max_epochs
        self.earlier = set(logged_runs(work_dir))
        self.shown = 0
        env = dict(os.environ, PYTHONPATH=root + os.pathsep +
                   os.environ.get('PYTHONPATH', ''))
        if device == 'cpu':
            env['CUDA_VISIBLE_DEVICES'] = ''
        os.makedirs(osp.dirname(log), exist_ok=True)
        self.start = time.time()
        with open(log, 'w') as f:
            self.proc = subprocess.Popen(
                [*train_command, config, '--work-dir', work_dir], cwd=root, stdout=f,
                stderr=subprocess.STDOUT, env=env)

    def records(self) -> List[dict]:
        """This run's logged records so far ([] before the first)."""
        runs = [r for r in logged_runs(self.work_dir) if r not in self.earlier]
        return read_scalars(self.work_dir, runs[-1]) if runs else []

    def new_epochs(self) -> List[Tuple[int, float]]:
        """(epoch, mean loss) of the epochs that ended since the last call."""
        finished = self.proc.poll() is not None
        out = ended_epochs(self.records(), self.shown, finished)
        if out:
            self.shown = out[-1][0]
        return out

    def failure(self) -> str:
        with open(self.log) as f:
            tail = f.readlines()[-30:]
        return (f'{self.label}: the training run failed (exit status '
                f'{self.proc.returncode}); the end of {self.log}:\n' + ''.join(tail))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def watch(runs: Sequence[TrainingRun], prefix: bool = False,
          poll_s: float = 1.0) -> None:
    """Wait for ``runs``, printing each epoch's mean loss as the epoch ends.

    Raises:
        RecipeError: a run failed (the others are stopped first), naming its log
            and quoting its end.
    """
    try:
        while True:
            done = all(r.proc.poll() is not None for r in runs)
            for run in runs:
                for epoch, loss in run.new_epochs():
                    name = f'{run.label}: ' if prefix else ''
                    say(f'      {name}epoch {epoch:>3d}/{run.max_epochs}  loss '
                        f'{loss:5.2f}  [{time.time() - run.start:.0f} s]')
                if run.proc.poll() not in (None, 0):
                    raise RecipeError(run.failure())
            if done:
                return
            time.sleep(poll_s)
    finally:
        for run in runs:
            run.stop()


def run_all(starts: Sequence[Callable[[], TrainingRun]], parallel: bool) -> None:
    """Start every run (``starts``: callables that start one each) and watch
    them side by side, or start each when the one before has ended."""
    if parallel:
        watch([start() for start in starts], prefix=len(starts) > 1)
    else:
        for start in starts:
            watch([start()])


# --------------------------------------------------------------------------- #
# What is printed
# --------------------------------------------------------------------------- #
def say(line: str = '') -> None:
    print(line, flush=True)


def _ci(c: dict, scale: float, sign: str = '') -> str:
    digits = 1 if scale > 1 else 3
    return (f'{scale * c["mean"]:{sign}6.{digits}f} [{scale * c["low"]:{sign}.{digits}f}, '
            f'{scale * c["high"]:{sign}.{digits}f}]')


def side_by_side(init: dict, teacher: dict, pair: dict, num_bank: int) -> str:
    """Three lines: k-NN top-1 (%) and the last block's Binary-AUC of the
    attention and of the cosine map, random init then teacher; the first two
    with the teacher's paired gain. ``init``, ``teacher``: entries of
    :func:`compare_models`'s ``models``; ``pair``: their entry of
    :func:`paired_gains`."""
    def auc(model, method):
        return model['auc_by_method'][method][-1]['auc']

    return (f'      k-NN top-1 (%, bank: {num_bank} training images): random '
            f'init {_ci(init["knn"], 100)}, DINO teacher {_ci(teacher["knn"], 100)}, '
            f'gain {_ci(pair["knn"], 100, "+")}\n'
            f'      Binary-AUC, attention map (last block): random init '
            f'{_ci(auc(init, "attention"), 1)}, DINO teacher '
            f'{_ci(auc(teacher, "attention"), 1)}, gain '
            f'{_ci(pair["auc"]["attention"], 1, "+")}\n'
            f'      Binary-AUC, cosine map (last block):    random init '
            f'{_ci(auc(init, "cosine"), 1)}, DINO teacher '
            f'{_ci(auc(teacher, "cosine"), 1)}')


def verdict(name: str, init: dict, teacher: dict, pair: dict,
            num_val: int) -> Tuple[str, bool]:
    """What the held-out measures say about one teacher, in words, and whether
    its means are higher than its init's on both k-NN and the attention map's
    Binary-AUC (the demo's gate).

    The words follow the 95 % interval of each paired gain
    (:func:`~mmdinomamba.studies.comparison.measures.order_word`): "better" or "worse"
    only where it excludes 0, "ties" where it includes 0, whatever the means.

    Returns:
        tuple: (the sentences, whether both means are higher).
    """
    from .measures import order_word

    def words(gain, what):
        order = order_word(gain)
        if order == 'tie':
            return f'{what} ties with the random init\'s (the interval includes 0)'
        return f'{what} is {order} than the random init\'s'

    auc_init = init['auc_by_method']['attention'][-1]['auc']['mean']
    auc_teacher = teacher['auc_by_method']['attention'][-1]['auc']['mean']
    auc_gain, knn_gain = pair['auc']['attention'], pair['knn']
    knn_init, knn_teacher = 100 * init['knn']['mean'], 100 * teacher['knn']['mean']
    parts = [
        words(auc_gain, 'its attention map\'s Binary-AUC') +
        f' ({auc_teacher:.3f} against {auc_init:.3f}, paired gain '
        f'{auc_gain["mean"]:+.3f} [{auc_gain["low"]:+.3f}, {auc_gain["high"]:+.3f}])',
        words(knn_gain, 'its k-NN top-1') +
        f' ({knn_teacher:.1f} % against {knn_init:.1f} %, paired gain '
        f'{100 * knn_gain["mean"]:+.1f} [{100 * knn_gain["low"]:+.1f}, '
        f'{100 * knn_gain["high"]:+.1f}] points)']
    passed = auc_teacher > auc_init and knn_teacher > knn_init
    result = ('higher on both' if passed else 'not higher on both')
    return (f'{name}: on {num_val} held-out images the DINO teacher is measured '
            f'against the same backbone at its random init: ' + '; '.join(parts) +
            f'. Its means are {result}.'), passed


def loss_fell(name: str, curve: Dict[int, float]) -> Tuple[str, bool]:
    """``('<name> loss: first (epoch i) -> last (epoch j)', fell)``: whether the
    last epoch's mean loss is below the first's (a rise in between is allowed)."""
    if not curve:
        return f'{name}: no loss was logged', False
    first, last = curve[min(curve)], curve[max(curve)]
    return (f'{name} loss: {first:.2f} (epoch {min(curve)}) -> {last:.2f} (epoch '
            f'{max(curve)})', last < first)


def shown(path: str) -> str:
    """``path`` relative to the current folder when it lies inside it."""
    rel = osp.relpath(path)
    return path if rel.startswith('..') else rel


# --------------------------------------------------------------------------- #
# Logs
# --------------------------------------------------------------------------- #
def log_to_file(path: str) -> MMLogger:
    """Send the libraries' log records and Python warnings to ``path`` only.

    mmengine's current logger becomes one that writes ``path`` and not the
    screen; warnings go there through the ``py.warnings`` logger, with those
    held by a ``MemoryHandler`` on it (the tools put one there before the
    libraries import) written first.
    """
    os.makedirs(osp.dirname(path), exist_ok=True)
    logger = MMLogger.get_instance(f'recipe-{time.time_ns()}', log_file=path,
                                   log_level='INFO', file_mode='a')
    files = [h for h in logger.handlers if isinstance(h, logging.FileHandler)]
    for handler in list(logger.handlers):
        if handler not in files:
            logger.removeHandler(handler)
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger('py.warnings')
    for handler in list(warnings_logger.handlers):
        if isinstance(handler, logging.handlers.MemoryHandler):
            handler.setTarget(files[0])
            handler.flush()
            warnings_logger.removeHandler(handler)
    warnings_logger.addHandler(files[0])
    warnings_logger.propagate = False
    return logger


# --------------------------------------------------------------------------- #
# The pipeline
# --------------------------------------------------------------------------- #
def run_recipe(preset: Preset, root: str, args: argparse.Namespace,
               train_command: Sequence[str]) -> bool:
    """Run ``preset`` (module docstring) from the repository at ``root`` with the
    options of ``tools/run_recipe.py``; whether its gate passed (True without a
    gate). ``train_command`` trains one config (:class:`TrainingRun`).

    Raises:
        RecipeError: a step failed.
    """
    from mmdinomamba.datasets import make_toy_dataset
    from .measures import (ModelSpec, compare_models, load_split, paired_gains)
    from .report import display, write_comparison_report

    work_dir, data_root = osp.abspath(args.work_dir), osp.abspath(args.data_root)
    models = [m for m in preset.models if m.name in args.models]
    device = args.device
    log_to_file(osp.join(work_dir, 'recipe.log'))
    steps = 4 if args.no_probe else 5
    number = iter(range(1, steps + 1))

    # 1. data
    data = dict(preset.data, train_per_class=args.train_per_class,
                val_per_class=args.val_per_class,
                placement=getattr(args, 'placement', None) or
                preset.data.get('placement', 'centred'))
    say(f'[{next(number)}/{steps}] toy dataset: {shown(data_root)} '
        f'({data["train_per_class"]} training and {data["val_per_class"]} held-out '
        f'images per class, {data["placement"]} placement)')
    start = time.time()
    make_toy_dataset(data_root, overwrite=preset.replace_data, **data)
    with open(osp.join(data_root, 'classes.txt')) as f:
        num_classes = len(f.read().split())
    say(f'      {num_classes} classes, ready [{time.time() - start:.0f} s]')

    # 2. DINO
    config_dir = osp.join(work_dir, 'configs')
    dino_configs, dino_losses = {}, {}
    for m in models:
        cfg = dino_config(osp.join(root, m.dino), data_root, args.epochs,
                          args.cfg_options, device, args.num_workers)
        dino_configs[m.name] = write_config(cfg, osp.join(config_dir,
                                                          f'{m.name}_dino.py'))
    names = ', '.join(m.name for m in models)
    if args.skip_train:
        say(f'[{next(number)}/{steps}] DINO pretraining: reusing the runs in '
            f'{shown(work_dir)} ({names})')
    else:
        epochs = Config.fromfile(dino_configs[models[0].name]).train_cfg.max_epochs
        say(f'[{next(number)}/{steps}] DINO pretraining of {names} on {device}, '
            f'{epochs} epochs{" side by side" if args.parallel else ""} (log: '
            f'{shown(osp.join(work_dir, "dino_<model>.log"))})')

        def start_dino(m):
            def start():
                if not args.parallel:
                    say(f'      {m.name}: {m.dino}')
                return TrainingRun(m.name, root, train_command, dino_configs[m.name],
                                   osp.join(work_dir, m.name),
                                   osp.join(work_dir, f'dino_{m.name}.log'), device)
            return start

        run_all([start_dino(m) for m in models], args.parallel)
    for m in models:
        dino_losses[m.name] = epoch_losses(read_scalars(osp.join(work_dir, m.name)))

    # 3. teachers
    from mmdinomamba.models.checkpoint import extract_dino_backbone
    say(f'[{next(number)}/{steps}] teacher backbones, and the weights each run '
        'started from (its random init)')
    backbones = {}
    for m in models:
        run_dir = osp.join(work_dir, m.name)
        last = latest_checkpoint(run_dir)
        teacher = osp.join(work_dir, f'{m.name}_teacher.pth')
        extract_dino_backbone(last, teacher)
        init = osp.join(run_dir, 'init.pth')
        if osp.isfile(init):
            extract_dino_backbone(init, osp.join(work_dir, f'{m.name}_init.pth'))
            init = osp.join(work_dir, f'{m.name}_init.pth')
            said = shown(init)
        else:
            init, said = None, 'none saved: a fresh draw of the config\'s init'
        backbones[m.name] = dict(dino=teacher, random=init)
        say(f'      {m.name}: {shown(last)} -> {shown(teacher)}; init: {said}')

    # 4. probes
    probes, probe_losses, probe_top1 = {}, {}, {}
    if not args.no_probe:
        rows = ('dino', 'random') if preset.probe_init else ('dino', )
        arch = [o for o in args.cfg_options if o.startswith('model.backbone.')]
        say(f'[{next(number)}/{steps}] linear probes ({", ".join(rows)} of each '
            f'model; log: {shown(osp.join(work_dir, "probe_<model>_<row>.log"))})')
        starts = []
        for m in models:
            for row in rows:
                key, probe_dir = f'{m.name}-{row}', osp.join(work_dir,
                                                             f'probe_{m.name}_{row}')
                cfg = probe_config(osp.join(root, m.probe), data_root,
                                   backbones[m.name][row], args.probe_epochs,
                                   arch + args.probe_cfg_options, device,
                                   args.num_workers)
                config = write_config(cfg, osp.join(config_dir, f'{key}_probe.py'))
                probes[key] = (config, probe_dir)
                if args.skip_train and epoch_checkpoints(probe_dir):
                    say(f'      {key}: reusing {shown(probe_dir)}')
                    continue

                def start(key=key, config=config, probe_dir=probe_dir):
                    if not args.parallel:
                        say(f'      {key}: {shown(config)}')
                    return TrainingRun(key, root, train_command, config, probe_dir,
                                       f'{probe_dir}.log', device)
                starts.append(start)
        run_all(starts, args.parallel)
        for key, (config, probe_dir) in probes.items():
            records = read_scalars(probe_dir)
            probe_losses[key] = epoch_losses(records)
            top1 = [r['accuracy/top1'] for r in records if 'accuracy/top1' in r]
            probes[key] = (osp.join(probe_dir, osp.basename(config)),
                           latest_checkpoint(probe_dir))
            if top1:
                probe_top1[key] = top1[-1]
            say(f'      {key}: top-1 on the held-out images '
                f'{top1[-1] if top1 else float("nan"):.1f} % (chance '
                f'{100 / num_classes:.0f} %)')

    # 5. the teacher against its init
    size = {Config.fromfile(c).model.backbone.img_size for c in dino_configs.values()}
    if len(size) != 1:
        raise RecipeError(f'the models take different image sizes {sorted(size)}: '
                          'one comparison needs one')
    size = size.pop()
    bank = load_split(data_root, 'meta/train.txt', 'train', size)
    val = load_split(data_root, 'meta/val.txt', 'val', size, mask_prefix='masks/val')
    say(f'[{next(number)}/{steps}] each teacher against the same backbone at its '
        f'random init: {len(val)} held-out images, {len(bank)} training images as '
        f'the k-NN bank, on {device}')
    specs = []
    for m in models:
        for row in ('dino', 'random'):
            spec = ModelSpec(f'{m.name}-{row}', dino_configs[m.name],
                             backbones[m.name][row])
            if preset.probes_in_report and f'{m.name}-{row}' in probes:
                spec.probe_config, spec.probe_checkpoint = probes[f'{m.name}-{row}']
            specs.append(spec)
    start = time.time()
    results = compare_models(specs, bank, val, rank_images=args.rank_images,
                             device=device, progress=True,
                             map_methods=preset.map_methods,
                             layers=list(preset.layers) if preset.layers else None)
    pairs = [(f'{m.name}-dino', f'{m.name}-random') for m in models]
    results['pairs'] = paired_gains(results, pairs)
    teachers = [f'{m.name}-dino' for m in models]
    results['between'] = paired_gains(results, [
        (b, a) for i, a in enumerate(teachers) for b in teachers[i + 1:]])
    for row in results['models']:
        # a probe the report does not score itself: the top-1 its run printed
        if row['probe'] is None and row['name'] in probe_top1:
            row['probe_logged'] = probe_top1[row['name']] / 100
    report_dir = osp.abspath(args.out) if args.out else osp.join(work_dir, 'report')
    paths = write_comparison_report(results, report_dir, display(val.images[:4]),
                                    val.label_maps[:4].numpy(), preset.title)
    say(f'      measured [{time.time() - start:.0f} s]')
    by_name = {r['name']: r for r in results['models']}
    passed, lines = True, []
    for m, pair in zip(models, results['pairs']):
        teacher, init = by_name[pair['model']], by_name[pair['base']]
        say(f'      {m.name}:')
        say(side_by_side(init, teacher, pair, len(bank)))
        sentence, beats = verdict(m.name, init, teacher, pair, len(val))
        lines.append(sentence)
        passed &= beats

    say()
    say('Results')
    curves = [(f'{m.name}, DINO', dino_losses[m.name]) for m in models] + \
        [(f'{key}, linear probe', curve) for key, curve in probe_losses.items()]
    for name, curve in curves:
        summary, fell = loss_fell(name, curve)
        say(f'  {summary}: {"it fell" if fell else "it did NOT fall"}')
        passed &= fell
    for m in models:
        prototypes = Config.fromfile(dino_configs[m.name]).model.head.out_channels
        say(f'  ({m.name}: log K = {math.log(prototypes):.2f} is the DINO loss of a '
            'uniform teacher and student)')
    for sentence in lines:
        say(f'  {sentence}')
    say(f'Report: {shown(paths["report.md"])}')
    say(f'Logs: {shown(work_dir)}/*.log; checkpoints: '
        f'{", ".join(shown(osp.join(work_dir, m.name)) for m in models)}')
    say(f'Figure: {shown(paths["activation_maps.png"])}: the same held-out images, '
        'their masks, and the attention map of each teacher and of its random init '
        'side by side')
    if preset.gate:
        say('PASSED: every loss fell and each teacher beats its random init' if passed
            else 'FAILED: a loss did not fall, or a teacher does not beat its random '
            'init on both k-NN and the attention map\'s Binary-AUC')
    return passed or not preset.gate

