"""The ``kernel`` mode: the SSD op (:func:`mmdinomamba.ops.ssd_scan`) on its own,
forward and forward+backward per backend."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence

import torch

from mmdinomamba.ops import resolve_backend, ssd_scan

from ..common import _fmt, time_ms

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
    """Forward and forward+backward milliseconds of
    :func:`mmdinomamba.ops.ssd_scan` per backend."""
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


def run(args, device: torch.device, amp: Optional[torch.dtype], result: dict) -> None:
    """The mode's part of the command line (``--amp``: the inputs' dtype)."""
    result['rows'] = run_kernel(args.backends, args.batch, args.seqlen, args.nheads,
                                args.headdim, args.dstate, args.ngroups, device,
                                amp or torch.float32, args.warmup, args.repeats,
                                args.iters)
