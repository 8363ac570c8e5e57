"""Time NonFiniteStopHook's per-step work on a DinoVim's gradients.

    python benchmarks/non_finite_check_cost.py [--arch tiny base] [--device cpu]
                                               [--runs 10]

Per step the hook flags every gradient the optimizer steps with (one multi-tensor
infinity norm per dtype) and reads one flag for them and the losses. This prints,
for each DinoVim preset, the gradient tensors and values and the milliseconds of
that work per step (random gradients of the backbone's shapes; the DINO head adds
its own few tensors).
"""
import argparse
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', nargs='+', default=['tiny', 'small', 'base'],
                        help='DinoVim presets (default: tiny small base)')
    parser.add_argument('--device', default='cpu', help='default: cpu')
    parser.add_argument('--runs', type=int, default=10,
                        help='timed steps per preset (default: 10)')
    return parser.parse_args(argv)


def check(grads, losses) -> bool:
    """The hook's work for one step: flag the gradients, one read."""
    import torch

    from mmdinomamba.engine.finite import finite_flags
    flags, _ = finite_flags(grads)
    return bool(torch.cat([torch.isfinite(v).reshape(-1) for v in losses] +
                          [flags]).all().item())


def main(argv=None):
    args = parse_args(argv)
    if args.runs < 1:
        raise ValueError(f'--runs must be >= 1, got {args.runs}')
    # imported after parsing, so that --help answers at once
    import torch

    from mmdinomamba.models import DinoVim
    device = torch.device(args.device)
    torch.manual_seed(0)
    for arch in args.arch:
        params = list(DinoVim(arch=arch).parameters())
        grads = [torch.randn(p.shape, device=device) for p in params]
        losses = [torch.tensor(7.3, device=device)]
        check(grads, losses)  # warm-up
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(args.runs):
            check(grads, losses)
        per_step = (time.perf_counter() - start) / args.runs
        values = sum(g.numel() for g in grads)
        print(f'DinoVim-{arch} on {device}: {len(grads)} gradient tensors, '
              f'{values / 1e6:.1f}M values: {per_step * 1e3:.2f} ms per step')


if __name__ == '__main__':
    main()
