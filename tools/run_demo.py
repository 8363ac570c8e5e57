"""The embedded default: DINO on toy data on a CPU, and proof that it learned.

    python tools/run_demo.py [--data-root data/toy_rich] [--work-dir work_dirs/demo]
                             [--probe]

1. generates the rich toy dataset (``mmdinomamba.datasets.make_toy_dataset`` with
   ``style='rich'``: shape-and-texture classes in random colours on cluttered
   backgrounds, with masks; a no-op if it is already there);
2. pretrains a 4-block DinoVim with DINO (``DINO_CONFIG`` through
   ``tools/train.py``) and prints the training loss per epoch;
3. extracts the teacher backbone (``tools/model_converters/extract_teacher.py``);
4. measures the teacher and the same backbone at random initialisation on the
   held-out split (``VAL_PER_CLASS`` images per class, with masks): k-NN top-1
   (cosine, k = 20, T = 0.07, the training split as the bank) and Binary-AUC
   (the last block's cosine activation maps, mean over heads), each with a 95 %
   bootstrap interval over images, side by side;
5. with ``--probe``, also trains the toy linear probe on the teacher;
6. prints where the checkpoints and logs are.

Each step's full log goes to ``<work-dir>/<step>.log``. The script fails (exit
status 1) if a step fails, if the DINO loss is not lower in the last epoch than in
the first, or if the teacher does not beat the random backbone on both k-NN
accuracy and Binary-AUC (see docs/dino.md, "The demo").
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import subprocess
import sys
import time
from collections import defaultdict
from typing import Dict, List, Tuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DINO_CONFIG = 'configs/dino/dino_dinovim-toy-p8_1xb8-6e_toy-rich.py'
PROBE_CONFIG = 'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py'
# the rich toy data: 4 (shape, texture) classes, >= 200 held-out images with masks
TOY_DATA = dict(num_classes=4, train_per_class=64, val_per_class=64, size=64,
                formats=('imagenet', ), style='rich')


def run_step(name: str, cmd: List[str], work_dir: str) -> float:
    """Run ``cmd`` from the repository root, logging to ``<work_dir>/<name>.log``."""
    log = osp.join(work_dir, f'{name}.log')
    start = time.time()
    with open(log, 'w') as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
                                       os.environ.get('PYTHONPATH', '')))
    if proc.returncode != 0:
        with open(log) as f:
            tail = f.readlines()[-30:]
        sys.exit(f'step {name!r} failed (exit status {proc.returncode}); last lines '
                 f'of {log}:\n' + ''.join(tail))
    return time.time() - start


def read_scalars(work_dir: str) -> List[dict]:
    """The scalars.json records of the latest run in an mmengine work dir."""
    runs = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not runs:
        sys.exit(f'no scalars.json under {work_dir}')
    with open(runs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def epoch_losses(records: List[dict]) -> Dict[int, float]:
    per_epoch = defaultdict(list)
    for rec in records:
        if 'loss' in rec and 'epoch' in rec:
            per_epoch[rec['epoch']].append(rec['loss'])
    return {e: sum(v) / len(v) for e, v in sorted(per_epoch.items())}


def loss_fell(name: str, curve: Dict[int, float]) -> str:
    """``'<name> loss: first (epoch i) -> last (epoch j)'``; exits (status 1) unless
    the last epoch's mean loss is below the first's."""
    if not curve:
        sys.exit(f'no {name} loss was logged')
    first, last = curve[min(curve)], curve[max(curve)]
    summary = (f'{name} loss: {first:.2f} (epoch {min(curve)}) -> {last:.2f} '
               f'(epoch {max(curve)})')
    if not last < first:
        sys.exit(f'the {name} loss did not decrease: {summary}')
    return summary


def print_curve(losses: Dict[int, float]) -> None:
    print('      epoch: ' + ' '.join(f'{e:>5d}' for e in losses))
    print('      loss:  ' + ' '.join(f'{v:5.2f}' for v in losses.values()))


def format_comparison(rows: List[Tuple[str, object, object]]) -> str:
    """The side-by-side table of (measure, random-init CI, DINO CI) rows.

    Each CI is a :class:`mmdinomamba.evaluation.BootstrapCI` (mean, low, high).
    """
    width = max(len(name) for name, _, _ in rows)
    lines = [f'      {"":{width}}  {"random init":>22}  {"DINO teacher":>22}']
    for name, random_ci, dino_ci in rows:
        cells = [f'{c.mean:.3f} [{c.low:.3f}, {c.high:.3f}]'
                 for c in (random_ci, dino_ci)]
        lines.append(f'      {name:{width}}  {cells[0]:>22}  {cells[1]:>22}')
    return '\n'.join(lines)


def not_beaten(rows: List[Tuple[str, object, object]]) -> List[str]:
    """The measures on which the DINO teacher's mean is not above random init's."""
    return [name for name, random_ci, dino_ci in rows
            if not dino_ci.mean > random_ci.mean]


def evaluate(config: str, teacher: str, data_root: str, seed: int = 0) -> list:
    """k-NN and Binary-AUC of the random-init and the DINO-teacher backbone.

    Returns:
        list: (measure name, random-init BootstrapCI, DINO BootstrapCI) rows.
    """
    from mmdinomamba.analysis.comparison import (ModelSpec, knn_hits, load_model,
                                                 load_split, measure_backbone)
    from mmdinomamba.analysis.loading import backbone_config
    from mmdinomamba.evaluation import bootstrap_ci
    config = osp.join(ROOT, config)
    size = backbone_config(config)['img_size']
    train = load_split(data_root, 'meta/train.txt', 'train', size)
    val = load_split(data_root, 'meta/val.txt', 'val', size, 'masks/val')
    results = {}
    for name, checkpoint in (('random', None), ('dino', teacher)):
        backbone = load_model(ModelSpec(name, config, checkpoint), seed)
        train_m = measure_backbone(backbone, train, [-1], with_maps=False)
        val_m = measure_backbone(backbone, val, [-1])
        last = max(val_m.readouts)
        hits = knn_hits(train_m, train.labels, val_m, val.labels, last)
        aucs = val_m.aucs[last][:, :-1].mean(axis=1)  # mean over heads per image
        results[name] = (bootstrap_ci(hits, seed=seed), bootstrap_ci(aucs, seed=seed))
    return [(f'k-NN top-1 (k=20, {len(val)} val images)', results['random'][0],
             results['dino'][0]),
            ('Binary-AUC (last block, mean over heads)', results['random'][1],
             results['dino'][1])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data-root', default='data/toy_rich',
                        help='toy dataset folder')
    parser.add_argument('--work-dir', default='work_dirs/demo',
                        help='folder for checkpoints and logs')
    parser.add_argument('--probe', action='store_true',
                        help='also train the toy linear probe on the teacher')
    args = parser.parse_args(argv)
    data_root = osp.abspath(osp.join(ROOT, args.data_root))
    work_dir = osp.abspath(osp.join(ROOT, args.work_dir))
    os.makedirs(work_dir, exist_ok=True)
    python = sys.executable
    steps = 5 if args.probe else 4

    sys.path.insert(0, ROOT)
    from mmengine.config import Config

    from mmdinomamba.datasets import make_toy_dataset
    num_prototypes = Config.fromfile(osp.join(ROOT, DINO_CONFIG)).model.head.out_channels
    start = time.time()
    make_toy_dataset(data_root, **TOY_DATA)
    print(f'[1/{steps}] rich toy dataset: {data_root} ({TOY_DATA["num_classes"]} '
          f'classes, {TOY_DATA["train_per_class"]} train and '
          f'{TOY_DATA["val_per_class"]} val images per class) '
          f'[{time.time() - start:.0f} s]')

    dino_dir = osp.join(work_dir, 'dino')
    data_opts = [f'train_dataloader.dataset.data_root={data_root}']
    seconds = run_step('dino', [python, 'tools/train.py', DINO_CONFIG, '--work-dir',
                                dino_dir, '--cfg-options', *data_opts], work_dir)
    losses = epoch_losses(read_scalars(dino_dir))
    print(f'[2/{steps}] DINO pretraining ({DINO_CONFIG}) [{seconds:.0f} s]')
    print_curve(losses)
    ckpts = sorted(glob.glob(osp.join(dino_dir, 'epoch_*.pth')),
                   key=lambda p: int(osp.basename(p)[6:-4]))
    if not ckpts:
        sys.exit(f'no checkpoint in {dino_dir}')

    teacher = osp.join(work_dir, 'dinovim-toy_dino-teacher.pth')
    run_step('extract_teacher', [python, 'tools/model_converters/extract_teacher.py',
                                 ckpts[-1], teacher], work_dir)
    print(f'[3/{steps}] teacher backbone of {osp.relpath(ckpts[-1], ROOT)} -> '
          f'{osp.relpath(teacher, ROOT)}')

    start = time.time()
    rows = evaluate(DINO_CONFIG, teacher, data_root)
    print(f'[4/{steps}] frozen features on the held-out split (mean [95 % bootstrap '
          f'interval over images]) [{time.time() - start:.0f} s]')
    print(format_comparison(rows))

    probe_dir = osp.join(work_dir, 'linear_probe')
    probe_losses = None
    if args.probe:
        classes = osp.join(data_root, 'classes.txt')
        probe_opts = [f'model.backbone.init_cfg.checkpoint={teacher}',
                      'model.backbone.init_cfg.prefix=None']
        for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            probe_opts += [f'{loader}.dataset.data_root={data_root}',
                           f'{loader}.dataset.classes={classes}']
        seconds = run_step('linear_probe', [python, 'tools/train.py', PROBE_CONFIG,
                                            '--work-dir', probe_dir, '--cfg-options',
                                            *probe_opts], work_dir)
        records = read_scalars(probe_dir)
        probe_losses = epoch_losses(records)
        accuracies = [r['accuracy/top1'] for r in records if 'accuracy/top1' in r]
        print(f'[5/5] linear probe ({PROBE_CONFIG}) [{seconds:.0f} s]')
        print_curve(probe_losses)
        print(f'      top-1 on the toy val split: {accuracies[-1]:.1f} % '
              f'(chance {100 / TOY_DATA["num_classes"]:.0f} %)')

    print('\nCheckpoints:')
    print(f'  DINO (student, teacher, centre, optimizer): {osp.relpath(ckpts[-1], ROOT)}')
    print(f'  teacher backbone:                           {osp.relpath(teacher, ROOT)}')
    for path in sorted(glob.glob(osp.join(probe_dir, 'epoch_*.pth'))):
        print(f'  linear probe:                               {osp.relpath(path, ROOT)}')
    print('Logs:')
    names = ('dino', 'extract_teacher') + (('linear_probe', ) if args.probe else ())
    for name in names:
        print(f'  {osp.relpath(osp.join(work_dir, name + ".log"), ROOT)}')
    for d in (dino_dir, probe_dir) if args.probe else (dino_dir, ):
        print(f'  {osp.relpath(d, ROOT)}/<timestamp>/ (mmengine log and '
              'vis_data/scalars.json)')
    print()
    print(loss_fell('DINO', losses))
    if probe_losses is not None:
        print(loss_fell('linear-probe', probe_losses))
    print(f'(DINO: log K = {math.log(num_prototypes):.2f} is the loss of a uniform '
          'teacher and student)')
    failed = not_beaten(rows)
    if failed:
        sys.exit('the DINO teacher does not beat the random backbone on: ' +
                 '; '.join(failed))
    print('The DINO teacher beats the same backbone at random initialisation on '
          'k-NN accuracy and on Binary-AUC.')


if __name__ == '__main__':
    main()
