"""The small comparison recipe: softmax, Mamba-2 and linear attention side by side.

    python tools/run_comparison.py [--work-dir work_dirs/compare] [--epochs 20]
        [--data-root data/toy_rich_compare] [--device cuda]
        [--train-per-class 500] [--val-per-class 100] [--parallel]
        [--cfg-options K=V ...] [--probe-epochs N] [--probe-cfg-options K=V ...]

1. generates the rich toy data (12 shape-and-texture classes, 64 px, with masks;
   a no-op when it is there);
2. DINO-pretrains the three configs of ``configs/compare/`` (ViT, DinoVim,
   LinearViT: same width, depth, data, head and schedule) through
   ``tools/train.py``, each for ``--epochs`` (the schedule follows, see
   :func:`schedule_options`), one after the other or, with ``--parallel``, at the
   same time;
3. extracts each teacher backbone (``tools/model_converters/extract_teacher.py``),
   and the teacher of ``init.pth``, the weights the run started from
   (``InitialWeightsHook`` in the configs);
4. trains a linear probe (``configs/compare/linear-probe_*.py``, through
   ``tools/train.py``) on each teacher and each init, unless ``--no-probe``;
5. runs ``tools/analysis/compare_mixers.py`` on the three teachers and the same
   three backbones at their own random init (``init.pth``; a run without one
   gets a fresh draw of the config's initialisation, ``random``), writing the
   report to ``<work-dir>/report``.

``--cfg-options`` go to every training run (after the epochs options), e.g. a CPU
check with a tiny budget::

    python tools/run_comparison.py --work-dir /tmp/cmp --epochs 1 --device cpu \\
        --train-per-class 4 --val-per-class 2 --rank-images 1 --cfg-options \\
        optim_wrapper.type=PerParamClipOptimWrapper train_dataloader.batch_size=8 \\
        train_dataloader.num_workers=0 model.backbone.arch.num_layers=2 --no-probe

(the probes read the last 4 blocks: a 2-block run needs ``--probe-cfg-options
model.backbone.out_indices=[-2,-1] model.backbone.frozen_stages=2
model.neck.in_channels=384 model.head.in_channels=384`` instead of ``--no-probe``).

Each step logs to ``<work-dir>/<step>.log``; a failed step stops the script
(exit status 1) with the end of its log.
"""
import argparse
import glob
import os
import os.path as osp
import subprocess
import sys
import time
from typing import List, Optional, Tuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = {
    'vit': 'configs/compare/dino_vit-d192-l12-p8_1xb128-20e_toy-rich.py',
    'dinovim': 'configs/compare/dino_dinovim-d192-l12-p8_1xb128-20e_toy-rich.py',
    'linearvit': 'configs/compare/dino_linearvit-d192-l12-p8_1xb128-20e_toy-rich.py',
}
PROBE_CONFIGS = {
    'vit': 'configs/compare/linear-probe_vit-d192-l12-p8_1xb128-30e_toy-rich.py',
    'dinovim': 'configs/compare/linear-probe_dinovim-d192-l12-p8_1xb128-30e_toy-rich.py',
    'linearvit':
    'configs/compare/linear-probe_linearvit-d192-l12-p8_1xb128-30e_toy-rich.py',
}
NUM_CLASSES = 12
IMAGE_SIZE = 64


def schedule_options(epochs: int) -> List[str]:
    """``--cfg-options`` that set the run length of a configs/compare/ recipe.

    Warm-up is a tenth of the run (at least one epoch); the cosine of the learning
    rate and of the weight decay end with the run.
    """
    if epochs < 1:
        raise ValueError(f'epochs must be >= 1, got {epochs}')
    warmup = max(1, epochs // 10) if epochs > 1 else 0
    opts = [f'train_cfg.max_epochs={epochs}',
            f'param_scheduler.0.end={max(warmup, 1)}',
            f'param_scheduler.1.begin={warmup}',
            f'param_scheduler.1.T_max={max(epochs - warmup, 1)}',
            f'param_scheduler.1.end={epochs}',
            f'param_scheduler.2.end={epochs}']
    return opts


def knn_data_options(config: str, data_root: str) -> List[str]:
    """``--cfg-options`` that point the config's ``KNNMonitorHook`` (if it has
    one) at ``data_root``: its bank and query loaders read the same dataset as
    the training run."""
    from mmengine.config import Config
    hooks = Config.fromfile(osp.join(ROOT, config)).get('custom_hooks', [])
    return [f'custom_hooks.{i}.{loader}.dataset.data_root={data_root}'
            for i, hook in enumerate(hooks) if hook.get('type') == 'KNNMonitorHook'
            for loader in ('bank_dataloader', 'query_dataloader')]


def probe_options(backbone: Optional[str], data_root: str) -> List[str]:
    """``--cfg-options`` of a linear-probe config (configs/compare/'s, or the toy
    one of tools/run_demo.py): its frozen backbone from ``backbone`` (a file of
    extract_teacher.py; None: the config's own initialisation, for a run without
    init.pth) and all three loaders on ``data_root`` and its ``classes.txt``."""
    opts = (['model.backbone.init_cfg=None'] if backbone is None else
            [f'model.backbone.init_cfg.checkpoint={backbone}',
             'model.backbone.init_cfg.prefix=None'])
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        opts += [f'{loader}.dataset.data_root={data_root}',
                 f'{loader}.dataset.classes={osp.join(data_root, "classes.txt")}']
    return opts


def start_step(name: str, cmd: List[str], work_dir: str):
    """Start ``cmd`` from the repository root, logging to ``<work_dir>/<name>.log``."""
    log = osp.join(work_dir, f'{name}.log')
    with open(log, 'w') as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
                                         os.environ.get('PYTHONPATH', '')))
    return name, proc, log, time.time()


def finish_step(step) -> float:
    """Wait for a started step; its seconds, or exit with the end of its log."""
    name, proc, log, start = step
    if proc.wait() != 0:
        with open(log) as f:
            tail = f.readlines()[-30:]
        sys.exit(f'step {name!r} failed (exit status {proc.returncode}); last lines '
                 f'of {log}:\n' + ''.join(tail))
    return time.time() - start


def run_step(name: str, cmd: List[str], work_dir: str) -> float:
    """Run ``cmd`` from the repository root, logging to ``<work_dir>/<name>.log``."""
    return finish_step(start_step(name, cmd, work_dir))


def finish_all(steps) -> List[float]:
    """Wait for started steps in order; their seconds. If one fails, the others are
    stopped before the script exits with its log (no run is left training)."""
    try:
        return [finish_step(step) for step in steps]
    finally:
        for _, proc, _, _ in steps:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()


def epoch_checkpoints(work_dir: str) -> List[str]:
    """The ``epoch_N.pth`` files of an mmengine work dir, by N."""
    return sorted(glob.glob(osp.join(work_dir, 'epoch_*.pth')),
                  key=lambda p: int(osp.basename(p)[6:-4]))


def latest_checkpoint(work_dir: str) -> str:
    """The highest ``epoch_N.pth`` of an mmengine work dir."""
    ckpts = epoch_checkpoints(work_dir)
    if not ckpts:
        sys.exit(f'no epoch_*.pth checkpoint in {work_dir}')
    return ckpts[-1]


def probe_epoch_options(epochs: int) -> List[str]:
    """``--cfg-options`` that set the length of a configs/compare/ linear probe
    (its cosine, its one validation and its checkpoint end with the run)."""
    if epochs < 1:
        raise ValueError(f'probe epochs must be >= 1, got {epochs}')
    return [f'train_cfg.max_epochs={epochs}', f'train_cfg.val_interval={epochs}',
            f'param_scheduler.0.T_max={epochs}', f'param_scheduler.0.end={epochs}',
            f'default_hooks.checkpoint.interval={epochs}']


def finished_probe(probe_dir: str, config: str) -> Optional[Tuple[str, str]]:
    """(config, checkpoint) of a finished probe run in ``probe_dir``, or None.

    The config is the runner's dump of the one it ran (``<probe_dir>/<config's
    file name>``, every override merged), so the comparison tool builds the
    classifier the checkpoint holds; the checkpoint is the highest epoch_N.pth.
    """
    dump = osp.join(probe_dir, osp.basename(config))
    ckpts = epoch_checkpoints(probe_dir)
    if not osp.isfile(dump) or not ckpts:
        return None
    return dump, ckpts[-1]


def train_probes(models, args, data_root: str, work_dir: str,
                 arch_opts: List[str]) -> dict:
    """Train the linear probe of every teacher and every init through
    ``tools/train.py`` (side by side with ``--parallel``; with ``--skip-train``
    a probe that finished is reused).

    Returns:
        dict: ``'<name>-dino'`` / ``'<name>-random'`` -> (the probe's config as
        the run saved it, overrides merged; its last checkpoint).
    """
    python = sys.executable
    runs, probes = [], {}
    for name, teacher, init in models:
        for row, backbone in (('dino', teacher), ('random', init)):
            probe_dir = osp.join(work_dir, f'probe_{name}_{row}')
            done = finished_probe(probe_dir, PROBE_CONFIGS[name]) \
                if args.skip_train else None
            if done is not None:
                probes[f'{name}-{row}'] = done
                print(f'[probe] {name}-{row}: reusing {osp.relpath(done[1], work_dir)}',
                      flush=True)
                continue
            opts = probe_options(None if backbone == 'random' else backbone,
                                 data_root)
            if args.probe_epochs is not None:
                opts += probe_epoch_options(args.probe_epochs)
            cmd = [python, 'tools/train.py', PROBE_CONFIGS[name], '--work-dir',
                   probe_dir, '--cfg-options', *opts, *arch_opts,
                   *args.probe_cfg_options]
            runs.append((name, row, probe_dir, cmd))
    if args.parallel:
        seconds = finish_all([start_step(f'probe_{name}_{row}', cmd, work_dir)
                              for name, row, _, cmd in runs])
    else:
        seconds = [run_step(f'probe_{name}_{row}', cmd, work_dir)
                   for name, row, _, cmd in runs]
    for (name, row, probe_dir, _), time_s in zip(runs, seconds):
        model = f'{name}-{row}'
        probes[model] = finished_probe(probe_dir, PROBE_CONFIGS[name])
        if probes[model] is None:
            sys.exit(f'the probe run of {model} left no checkpoint and config dump '
                     f'in {probe_dir}')
        print(f'[probe] {model}: {osp.relpath(probes[model][1], work_dir)} '
              f'[{time_s:.0f} s]', flush=True)
    return probes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work-dir', default='work_dirs/compare')
    parser.add_argument('--data-root', default='data/toy_rich_compare')
    parser.add_argument('--epochs', type=int, default=20)
    parser.add_argument('--train-per-class', type=int, default=500)
    parser.add_argument('--val-per-class', type=int, default=100)
    parser.add_argument('--models', nargs='+', choices=sorted(CONFIGS),
                        default=list(CONFIGS), help='which recipes to run')
    parser.add_argument('--device', default='cuda',
                        help="device of the comparison tool ('cpu' or 'cuda')")
    parser.add_argument('--rank-images', type=int, default=4)
    parser.add_argument('--skip-train', action='store_true',
                        help='reuse the DINO checkpoints already in the work dirs, '
                        'and the linear probes that finished')
    parser.add_argument('--parallel', action='store_true',
                        help='train the models at the same time (small models on '
                        'one GPU leave it mostly idle: each run is bound by its '
                        "host process; give each fewer data workers, e.g. "
                        "--cfg-options train_dataloader.num_workers=4)")
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='key=value overrides for every training run')
    parser.add_argument('--no-probe', action='store_true',
                        help='no linear probes (the report leaves their column '
                        'empty)')
    parser.add_argument('--probe-epochs', type=int,
                        help="the probes' epochs (default: their config's)")
    parser.add_argument('--probe-cfg-options', nargs='+', default=[],
                        help='key=value overrides for every linear probe (after '
                        'the model.backbone.* ones of --cfg-options)')
    args = parser.parse_args(argv)
    work_dir = osp.abspath(args.work_dir)
    data_root = osp.abspath(args.data_root)
    os.makedirs(work_dir, exist_ok=True)
    python = sys.executable

    sys.path.insert(0, ROOT)
    from mmdinomamba.datasets import make_toy_dataset
    start = time.time()
    make_toy_dataset(data_root, num_classes=NUM_CLASSES,
                     train_per_class=args.train_per_class,
                     val_per_class=args.val_per_class, size=IMAGE_SIZE,
                     formats=('imagenet', ), style='rich')
    print(f'[data] {data_root} [{time.time() - start:.0f} s]', flush=True)

    def train(name):
        opts = schedule_options(args.epochs) + [
            f'train_dataloader.dataset.data_root={data_root}'] + \
            knn_data_options(CONFIGS[name], data_root) + args.cfg_options
        return start_step(f'train_{name}', [python, 'tools/train.py', CONFIGS[name],
                                            '--work-dir', osp.join(work_dir, name),
                                            '--cfg-options', *opts], work_dir)

    def report(name, seconds):
        print(f'[train] {name}: {CONFIGS[name]} [{seconds:.0f} s]', flush=True)

    if not args.skip_train:
        if args.parallel:  # all runs side by side
            for name, seconds in zip(args.models,
                                     finish_all([train(n) for n in args.models])):
                report(name, seconds)
        else:
            for name in args.models:
                report(name, finish_step(train(name)))

    def extract(name, ckpt, suffix):
        teacher = osp.join(work_dir, f'{name}_{suffix}.pth')
        run_step(f'extract_{name}_{suffix}',
                 [python, 'tools/model_converters/extract_teacher.py', ckpt, teacher],
                 work_dir)
        print(f'[teacher] {name}: {osp.relpath(ckpt, work_dir)} -> '
              f'{osp.relpath(teacher, work_dir)}', flush=True)
        return teacher

    models = []
    for name in args.models:
        teacher = extract(name, latest_checkpoint(osp.join(work_dir, name)), 'teacher')
        init = osp.join(work_dir, name, 'init.pth')
        if osp.isfile(init):
            init = extract(name, init, 'init')
        else:
            print(f'[teacher] {name}: no {osp.relpath(init, work_dir)}; random init '
                  'is a fresh draw of the config\'s initialisation', flush=True)
            init = 'random'
        models.append((name, teacher, init))

    arch_opts = [o for o in args.cfg_options if o.startswith('model.backbone.')]
    probes = {}
    if not args.no_probe:
        probes = train_probes(models, args, data_root, work_dir, arch_opts)

    compare = [python, 'tools/analysis/compare_mixers.py', '--out-dir',
               osp.join(work_dir, 'report'), '--data-root', data_root,
               '--img-size', str(IMAGE_SIZE), '--device', args.device,
               '--rank-images', str(args.rank_images), '--no-progress']
    for name, teacher, init in models:
        # the tool reads model.backbone from the training config (with any
        # architecture override, the random init must match the teacher)
        config = CONFIGS[name]
        compare += ['--model', f'{name}-dino', config, teacher,
                    '--model', f'{name}-random', config, init,
                    '--pair', f'{name}-dino', f'{name}-random']
    for model, (config, ckpt) in probes.items():
        compare += ['--probe', model, config, ckpt]
    if arch_opts:
        compare += ['--cfg-options', *arch_opts]
    seconds = run_step('compare', compare, work_dir)
    with open(osp.join(work_dir, 'compare.log')) as f:
        print(f.read().strip())
    print(f'[report] {osp.join(work_dir, "report", "report.md")} [{seconds:.0f} s]')


if __name__ == '__main__':
    main()
