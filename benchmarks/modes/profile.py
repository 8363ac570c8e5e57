"""The ``profile`` mode: where one step of one model spends its time."""
from __future__ import annotations

from typing import List, Optional

import torch

from ..common import build_model, model_table, synchronize
from .models import _steps

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


def run(args, device: torch.device, amp: Optional[torch.dtype], result: dict) -> None:
    """The mode's part of the command line."""
    result['settings'].update(model=args.model, size=args.size, batch=args.batch,
                              step=args.step, host=args.host)
    rows = profile_model(model_table()[args.model], args.size, args.batch, device, amp,
                         args.step, args.warmup, args.iters, host=args.host)
    result['rows'] = rows
    print(format_profile(rows, args.top))
