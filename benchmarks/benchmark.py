"""Speed and memory of the backbones, of the DINO training step and of the SSD op.

A benchmark beside the package (it is not installed with it), run from a checkout::

    python benchmarks/benchmark.py dino-step            # the shipped DINO configs
    python benchmarks/benchmark.py models --sizes 224 1024 --batch-sizes 128 4 \\
        --out work_dirs/benchmark.json
    python benchmarks/benchmark.py --device cpu host    # the fused path's host work
    python benchmarks/benchmark.py kernel --batch 128 --seqlen 198
    python benchmarks/benchmark.py profile --model dinovim-base --step train
    python benchmarks/benchmark.py --amp bf16 loop --task cls --models mlla-tiny \\
        swin-tiny --size 224 --batch 128      # tools/train.py, synthetic data

This file is the command line; each mode is a module of ``benchmarks/modes/``
(``models``, ``dino_step``, ``host``, ``kernel``, ``profile``, ``loop``) and
``benchmarks/common.py`` holds what they share (timing, counting, the models,
the output). ``benchmarks/README.md`` says what each mode measures and holds the
current figures. Every mode but ``loop`` measures in one process, so that ratios
compare like with like; the table goes to stdout and ``--out`` writes the
results (atomically; ``models`` and ``loop`` also after each row, marked
``partial``): JSON, or CSV rows when the path ends in ``.csv``, both with the
commit measured (``code``: the short hash, ``+dirty`` for uncommitted changes).
Models are named as :mod:`mmdinomamba.zoo` names them (mmpretrain-style names,
short aliases accepted), plus the variants of ``benchmarks/names.py`` and the
baselines the zoo lacks (``swin-tiny``).
"""
import argparse
import os.path as osp
import sys

# the repository's root, so that ``benchmarks.*`` imports from any folder (at the
# end of the path: the installed package keeps its place)
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.append(REPO)

from benchmarks.names import (AMP_DTYPES, BASELINE, CLS_CONFIGS,  # noqa: E402
                              COMPILE_MODES, COMPILE_SCOPES, COMPILED, CONFIG_DIR,
                              DINO_BASELINE, DINO_CONFIGS, LAUNCHES, TASKS)

MODES = {'models': 'models', 'dino-step': 'dino_step', 'host': 'host',
         'kernel': 'kernel', 'profile': 'profile', 'loop': 'loop'}
NAMES_HELP = ("a name of mmdinomamba.zoo (or its short alias: 'mlla-t', 'vit-b', "
              "'reg-b', ...), 'swin-tiny', or a variant: DinoVim's '-loop', MLLA's "
              "'-rope-per-call' and '-graphed' (e.g. 'mlla-t-graphed')")

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
    parser.add_argument('--out', help='write the results here: JSON, or CSV rows when '
                        'the path ends in .csv')
    sub = parser.add_subparsers(dest='mode', required=True)
    m = sub.add_parser('models', help='backbone throughput and memory')
    m.add_argument('--models', nargs='+', metavar='MODEL', help=NAMES_HELP,
                   default=['dinovim-tiny', 'dinovim-small', 'dinovim-base',
                            'dinomamba-reg-base', 'linearvit-base'])
    m.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024])
    m.add_argument('--batch-sizes', nargs='+', type=int, default=[128, 16, 4],
                   help='one per size')
    m.add_argument('--modes', nargs='+', choices=['infer', 'train'],
                   default=['infer', 'train'])
    m.add_argument('--ssd-backend', default='auto', metavar='BACKEND',
                   help="DinoVim mixers' ssd_backend ('auto': fused Triton on CUDA)")
    m.add_argument('--baseline', metavar='MODEL', default=BASELINE,
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
    d.add_argument('--models', nargs='+', metavar='MODEL',
                   default=['dinovim-tiny', 'dinovim-small', 'dinovim-base'],
                   help=f'of {sorted(DINO_CONFIGS)} or a short alias')
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
    h.add_argument('--models', nargs='+', metavar='MODEL',
                   default=['dinovim-base', 'dinovim-base-loop'],
                   help=f'DinoVim and MLLA models: {NAMES_HELP}')
    h.add_argument('--baseline', default='dinovim-base-loop',
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
    p.add_argument('--model', metavar='MODEL', default='dinovim-base', help=NAMES_HELP)
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
    # after parsing: --help and usage errors come at once (torch and the package
    # take seconds to import)
    import torch

    from benchmarks import common
    from mmdinomamba.ops import BACKENDS
    check_names(parser, args, common)
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


def check_names(parser: argparse.ArgumentParser, args, common) -> None:
    """Resolve the model names of ``args`` (aliases to the table's names) and
    refuse, as argparse's ``choices`` would, a name the mode does not know (the
    host mode's ``--baseline`` may name none of its models: then no ratios)."""
    table = common.model_table()
    known = dict(models=sorted(table), profile=sorted(table),
                 host=sorted(n for n, s in table.items()
                             if s['type'] in ('DinoVim', 'MLLA')),
                 baseline=sorted(table))
    known['dino-step'] = sorted(DINO_CONFIGS)
    for option in ('models', 'model', 'baseline'):
        value = getattr(args, option, None)
        if value is None or args.mode == 'loop':  # loop: its task's configs decide
            continue
        names = [common.model_name(n) for n in
                 (value if isinstance(value, list) else [value])]
        choices = known['baseline' if option == 'baseline' else args.mode]
        for name in names:
            if name not in choices and not (args.mode == 'host' and option == 'baseline'):
                parser.error(f'argument --{option}: invalid choice: {name!r} (choose '
                             f"from {', '.join(map(repr, choices))})")
        setattr(args, option, names if isinstance(value, list) else names[0])


def main(argv=None) -> dict:
    args = parse_args(argv)
    import importlib

    import torch

    from benchmarks.common import environment, write_result
    mode = importlib.import_module(f'benchmarks.modes.{MODES[args.mode]}')
    if args.mode == 'loop':
        return mode.run(args)
    device = torch.device(args.device)
    if args.amp is None:
        args.amp = 'none' if args.mode == 'host' else 'bf16'
    amp = getattr(torch, AMP_DTYPES[args.amp]) if AMP_DTYPES[args.amp] else None
    result = dict(mode=args.mode, environment=environment(device),
                  settings=dict(amp=args.amp, warmup=args.warmup, repeats=args.repeats,
                                iters=args.iters), command=' '.join(sys.argv))
    mode.run(args, device, amp, result)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == '__main__':
    main()
