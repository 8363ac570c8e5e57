"""Speed and memory of the backbones, of the DINO training step and of the SSD op.

A thin command line over :mod:`mmdinomamba.analysis.benchmark` (which says what
each mode measures). Every mode measures in one process, so ratios compare like
with like; the table goes to stdout and ``--out`` writes the full results as JSON
(atomically).

Examples::

    python tools/analysis/benchmark.py dino-step            # the shipped DINO configs
    python tools/analysis/benchmark.py models --sizes 224 1024 --batch-sizes 128 4 \\
        --out work_dirs/benchmark.json
    python tools/analysis/benchmark.py host     # the fused path's host work, on a CPU
    python tools/analysis/benchmark.py kernel --batch 128 --seqlen 198
    python tools/analysis/benchmark.py profile --model dinovim-b --step train
"""
import argparse
import sys

import torch

from mmdinomamba.analysis.benchmark import (AMP_DTYPES, BASELINE, DINO_BASELINE,
                                            DINO_CONFIGS, MODELS, environment,
                                            format_dino_table, format_host_table,
                                            format_profile, format_table, profile_model,
                                            run_dino_steps, run_host, run_kernel,
                                            run_models)
from mmdinomamba.engine.checkpoint import dump_atomic
from mmdinomamba.ops import BACKENDS

COMPILE_MODES = ['default', 'reduce-overhead', 'max-autotune',
                 'max-autotune-no-cudagraphs']


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES),
                        help='autocast dtype (kernel mode: input dtype); default bf16, '
                        "none in host mode (on a CPU, bf16 matrix products time the "
                        "CPU's bf16 arithmetic, not host work)")
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
    m.add_argument('--rounds', type=int, default=1,
                   help='measure every model this many times, taking turns, and keep '
                   "each one's best round (a shared host's speed drifts)")
    m.add_argument('--cuda-graph', action='store_true',
                   help='also time each step replayed from a CUDA graph (gInfer, gTrain)')
    m.add_argument('--compile', choices=COMPILE_MODES,
                   help='torch.compile every model (the baseline too) in this mode first')
    m.add_argument('--graph-blocks', action='store_true',
                   help="replay DinoVim's blocks from CUDA graphs in the eager steps "
                   '(what CUDAGraphBlocksHook does)')
    d = sub.add_parser('dino-step', help='the DINO training step of the shipped configs')
    d.add_argument('--models', nargs='+', choices=sorted(DINO_CONFIGS),
                   default=['dinovim-t', 'dinovim-s', 'dinovim-b'])
    d.add_argument('--host-batch', type=int, default=2,
                   help='images per view of the host-bound run (0: skip it)')
    d.add_argument('--no-baseline', action='store_true',
                   help=f'skip the {DINO_BASELINE} baseline (no ratios)')
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
    h.add_argument('--models', nargs='+',
                   choices=sorted(n for n, m in MODELS.items() if m['type'] == 'DinoVim'),
                   default=['dinovim-b', 'dinovim-b-loop'])
    h.add_argument('--baseline', default='dinovim-b-loop',
                   help="the row the others' ratios refer to (one of --models)")
    h.add_argument('--width', type=int, default=64,
                   help='channels (the depth and layout are the model\'s own)')
    h.add_argument('--batch', type=int, default=2)
    h.add_argument('--rounds', type=int, default=3,
                   help='the models take turns; each keeps its lowest median')
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
    p.add_argument('--host', action='store_true',
                   help="the host's self time per operator and autograd function "
                        '(on CUDA: instead of the time per kernel)')
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.amp is None:
        args.amp = 'none' if args.mode == 'host' else 'bf16'
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
                                  cuda_graph=args.cuda_graph, compile=args.compile,
                                  graph_blocks=args.graph_blocks, rounds=args.rounds)
        if args.cuda_graph and device.type != 'cuda':
            raise ValueError('benchmark: --cuda-graph needs a CUDA device')
        rows = run_models(specs, args.sizes, args.batch_sizes, device, amp, args.modes,
                          args.warmup, args.repeats, args.iters, baseline,
                          args.cuda_graph, args.compile, args.graph_blocks, args.rounds)
        result['rows'] = rows
        if args.rounds > 1:
            print(f'best of {args.rounds} rounds per model:')
        print(format_table(rows, baseline))
    elif args.mode == 'dino-step':
        baseline = None if args.no_baseline else DINO_BASELINE
        names = ([baseline] if baseline else []) + [
            n for n in args.models if n != baseline]
        configs = {n: DINO_CONFIGS[n] for n in names}
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
                                  rounds=args.rounds)
        specs = {name: MODELS[name] for name in args.models}
        baseline = args.baseline if args.baseline in specs else None
        rows = run_host(specs, baseline, args.rounds, width=args.width, batch=args.batch,
                        warmup=args.warmup, repeats=args.repeats, iters=args.iters,
                        amp=amp)
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


if __name__ == '__main__':
    main()
