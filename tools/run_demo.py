"""The embedded default: DINO pretraining and a linear probe on toy data, on a CPU.

    python tools/run_demo.py [--data-root data/toy] [--work-dir work_dirs/demo]
                             [--cfg-options KEY=VALUE ...]  # DINO config overrides

1. generates the toy dataset (``mmdinomamba.datasets.make_toy_dataset``; a no-op
   if it is already there);
2. pretrains a 4-block DinoVim with DINO (``configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py``
   through ``tools/train.py``) and prints the training loss per epoch;
3. extracts the teacher backbone (``tools/model_converters/extract_teacher.py``);
4. trains a linear probe on it (``configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py``)
   and prints its top-1 accuracy on the toy validation split;
5. measures the teacher and the same backbone at its random init (``init.pth``,
   the weights the DINO run started from: ``InitialWeightsHook``) on the 2000
   held-out images, side by side: k-NN top-1 (the training images as the bank)
   and the Binary-AUC of the last block's attention map (the [CLS] row of the
   mixing matrix) and cosine map, each with its bootstrap interval, and the
   teacher's gain on the first two with its paired interval (the same images
   resampled for both; ``mmdinomamba.analysis.comparison``, as
   ``tools/analysis/compare_mixers.py``);
6. prints where the checkpoints and logs are.

Each step's full log goes to ``<work-dir>/<step>.log``. The script fails (exit
status 1) if a step fails, or if the DINO loss or the linear probe's training loss
is not lower in the last epoch than in the first (see docs/dino.md, "The demo"), or
if in step 5 the teacher does not beat its random init on both measures (a higher
mean over the held-out images; whether the gain's paired interval lies above 0 is
printed too: on this budget it does for the Binary-AUC, and for k-NN in some runs,
docs/comparison.md, "Ninth round").
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import sys
import time
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from mmengine.config import Config

# the step runner, checkpoint listing and probe overrides of the comparison
# recipe, a script beside this one (tools/ is on the path when run as a script;
# put there for an import by file path)
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from run_comparison import (ROOT, epoch_checkpoints, latest_checkpoint,  # noqa: E402
                            probe_options, run_step)

DINO_CONFIG = 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py'
PROBE_CONFIG = 'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py'


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


# the rich toy style (class = shape x texture, random colours, cluttered
# background), 64 px: 256 training images and 2000 held-out ones for step 5. On
# 200 held-out images the k-NN gain of the teacher over its init (+2 points on
# average) was below the noise of the images drawn, and the verdict a coin flip
# between seeds (docs/comparison.md, "Ninth round")
TOY_DATA = dict(style='rich', train_per_class=64, val_per_class=500, size=64)


def held_out_measures(config: str, teacher: str, data_root: str,
                      init: Optional[str] = None) -> List[dict]:
    """The backbone of ``config`` at random init (the weights of ``init``, the
    run's own start, or a fresh draw when None), then with the ``teacher``
    weights, measured by :func:`mmdinomamba.analysis.comparison.compare_models` on
    the toy val split (the training split as the k-NN bank): per model ``knn``
    (top-1), ``auc`` (the attention map's Binary-AUC: last block, mean over heads,
    then images) and ``auc_cosine`` (the cosine map's), each a BootstrapCI, and
    ``num_val`` / ``num_bank``; the teacher's also has ``gain``: its paired gain
    over the init on ``knn`` and ``auc`` (per-image differences on the same
    images, :func:`~mmdinomamba.analysis.comparison.paired_gain`)."""
    from mmdinomamba.analysis.comparison import (ModelSpec, compare_models,
                                                 load_split, paired_gain)
    from mmdinomamba.evaluation import BootstrapCI
    path = osp.join(ROOT, config)
    size = Config.fromfile(path).model.backbone.img_size
    bank = load_split(data_root, 'meta/train.txt', 'train', size)
    val = load_split(data_root, 'meta/val.txt', 'val', size, mask_prefix='masks/val')
    report = compare_models([ModelSpec('random init', path, init),
                             ModelSpec('DINO teacher', path, teacher)], bank, val,
                            rank_images=0, progress=False,
                            map_methods=('attention', 'cosine'), layers=[-1])
    measures = [dict(knn=BootstrapCI(**m['knn']),
                     auc=BootstrapCI(**m['auc_by_method']['attention'][-1]['auc']),
                     auc_cosine=BootstrapCI(**m['auc_by_method']['cosine'][-1]['auc']),
                     num_val=len(val), num_bank=len(bank)) for m in report['models']]
    init_model, teacher_model = report['models']
    measures[1]['gain'] = dict(knn=paired_gain(init_model, teacher_model, 'knn'),
                               auc=paired_gain(init_model, teacher_model, 'attention'))
    return measures


def print_curve(losses: Dict[int, float]) -> None:
    print('      epoch: ' + ' '.join(f'{e:>5d}' for e in losses))
    print('      loss:  ' + ' '.join(f'{v:5.2f}' for v in losses.values()))


def side_by_side(random_init: dict, dino: dict) -> str:
    """Three lines: k-NN top-1 (%) and the Binary-AUC of the attention and the
    cosine map, random init then teacher; the first two with the teacher's paired
    gain."""
    def ci(c, scale, sign=''):
        digits = 1 if scale > 1 else 3
        return (f'{scale * c.mean:{sign}6.{digits}f} [{scale * c.low:{sign}.{digits}f}, '
                f'{scale * c.high:{sign}.{digits}f}]')
    gain = dino['gain']
    return (f'      k-NN top-1 (%, bank: {dino["num_bank"]} training images): random '
            f'init {ci(random_init["knn"], 100)}, DINO teacher {ci(dino["knn"], 100)}, '
            f'gain {ci(gain["knn"], 100, "+")}\n'
            f'      Binary-AUC, attention map (last block): random init '
            f'{ci(random_init["auc"], 1)}, DINO teacher {ci(dino["auc"], 1)}, '
            f'gain {ci(gain["auc"], 1, "+")}\n'
            f'      Binary-AUC, cosine map (last block):    random init '
            f'{ci(random_init["auc_cosine"], 1)}, DINO teacher '
            f'{ci(dino["auc_cosine"], 1)}')


def verdict(random_init: dict, dino: dict) -> Tuple[str, bool]:
    """Whether the teacher beats random init on k-NN and on the attention map's
    Binary-AUC: ``(sentence, passed)``. It beats it on a measure when its mean over
    the held-out images is higher; the sentence also says whether the paired
    interval of the gain (``dino['gain']``) lies above 0 or includes it (then the
    gain is within the noise of that many images). ``passed`` is True when it
    beats it on both."""
    words, passed = [], True
    for key, name in (('knn', 'k-NN'), ('auc', 'Binary-AUC (attention map)')):
        r, d = random_init[key], dino[key]
        if d.mean > r.mean:
            sure = 'above 0' if dino['gain'][key].low > 0 else 'includes 0'
            words.append(f'{name}: beats random init (gain interval {sure})')
        else:
            passed = False
            words.append(f'{name}: does not beat random init')
    return 'DINO teacher ' + '; '.join(words), passed


def final_checks(losses: Dict[int, float], probe_losses: Dict[int, float],
                 num_prototypes: int, random_init: dict, dino: dict) -> None:
    """The demo's last lines; exits (status 1) unless both losses fell and the
    teacher beats its random init on both held-out measures (:func:`verdict`)."""
    for name, curve in (('DINO', losses), ('linear-probe', probe_losses)):
        print(loss_fell(name, curve))
    print(f'(DINO: log K = {math.log(num_prototypes):.2f} is the loss of a uniform '
          'teacher and student)')
    sentence, passed = verdict(random_init, dino)
    print(sentence)
    if not passed:
        sys.exit('the DINO teacher does not beat its random init on both k-NN and '
                 "the attention map's Binary-AUC (held-out images)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data-root', default='data/toy', help='toy dataset folder')
    parser.add_argument('--work-dir', default='work_dirs/demo',
                        help='folder for checkpoints and logs')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help="overrides of the DINO config, as tools/train.py's "
                        '(e.g. randomness.seed=1)')
    args = parser.parse_args(argv)
    data_root = osp.abspath(osp.join(ROOT, args.data_root))
    work_dir = osp.abspath(osp.join(ROOT, args.work_dir))
    os.makedirs(work_dir, exist_ok=True)
    python = sys.executable

    sys.path.insert(0, ROOT)
    from mmdinomamba.datasets import make_toy_dataset
    num_prototypes = Config.fromfile(osp.join(ROOT, DINO_CONFIG)).model.head.out_channels
    start = time.time()
    make_toy_dataset(data_root, overwrite=True, **TOY_DATA)
    with open(osp.join(data_root, 'classes.txt')) as f:
        num_classes = len(f.read().split())
    print(f'[1/5] toy dataset: {data_root} ({num_classes} classes) '
          f'[{time.time() - start:.0f} s]')

    dino_dir = osp.join(work_dir, 'dino')
    data_opts = [f'train_dataloader.dataset.data_root={data_root}', *args.cfg_options]
    seconds = run_step('dino', [python, 'tools/train.py', DINO_CONFIG, '--work-dir',
                                dino_dir, '--cfg-options', *data_opts], work_dir)
    losses = epoch_losses(read_scalars(dino_dir))
    print(f'[2/5] DINO pretraining ({DINO_CONFIG}) [{seconds:.0f} s]')
    print_curve(losses)
    last = latest_checkpoint(dino_dir)

    teacher = osp.join(work_dir, 'dinovim-toy_dino-teacher.pth')
    run_step('extract_teacher', [python, 'tools/model_converters/extract_teacher.py',
                                 last, teacher], work_dir)
    print(f'[3/5] teacher backbone of {osp.relpath(last, ROOT)} -> '
          f'{osp.relpath(teacher, ROOT)}')
    # the weights the run started from (InitialWeightsHook): "random init" below
    init = osp.join(work_dir, 'dinovim-toy_init.pth')
    run_step('extract_init', [python, 'tools/model_converters/extract_teacher.py',
                              osp.join(dino_dir, 'init.pth'), init], work_dir)

    probe_dir = osp.join(work_dir, 'linear_probe')
    seconds = run_step('linear_probe', [python, 'tools/train.py', PROBE_CONFIG,
                                        '--work-dir', probe_dir, '--cfg-options',
                                        *probe_options(teacher, data_root)], work_dir)
    records = read_scalars(probe_dir)
    probe_losses = epoch_losses(records)
    accuracies = [r['accuracy/top1'] for r in records if 'accuracy/top1' in r]
    print(f'[4/5] linear probe ({PROBE_CONFIG}) [{seconds:.0f} s]')
    print_curve(probe_losses)
    print(f'      top-1 on the toy val split: {accuracies[-1]:.1f} % '
          f'(chance {100 / num_classes:.0f} %)')

    start = time.time()
    random_init, dino = held_out_measures(DINO_CONFIG, teacher, data_root, init)
    print(f'[5/5] teacher against the same backbone at its random init, '
          f'{dino["num_val"]} held-out images [{time.time() - start:.0f} s]')
    print(side_by_side(random_init, dino))

    print('\nCheckpoints:')
    print(f'  DINO (student, teacher, centre, optimizer): {osp.relpath(last, ROOT)}')
    print(f'  teacher backbone:                           {osp.relpath(teacher, ROOT)}')
    for path in epoch_checkpoints(probe_dir):
        print(f'  linear probe:                               {osp.relpath(path, ROOT)}')
    print('Logs:')
    for name in ('dino', 'extract_teacher', 'linear_probe'):
        print(f'  {osp.relpath(osp.join(work_dir, name + ".log"), ROOT)}')
    for d in (dino_dir, probe_dir):
        print(f'  {osp.relpath(d, ROOT)}/<timestamp>/ (mmengine log and '
              'vis_data/scalars.json)')
    print()
    final_checks(losses, probe_losses, num_prototypes, random_init, dino)

if __name__ == '__main__':
    main()
