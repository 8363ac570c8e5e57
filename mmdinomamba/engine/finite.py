"""Finiteness of many tensors in one fused pass: one device read, not one per tensor.

A NaN or an infinity anywhere in a tensor makes its largest magnitude (the infinity
norm, which propagates NaN and cannot overflow) non-finite, so one multi-tensor
kernel (``torch._foreach_norm``) per dtype gives a per-tensor flag and one
``.item()`` reads them all. The names of the offenders are looked up only when that read says there
is one.
"""
from typing import Dict, Iterable, List, Sequence, Tuple

import torch
import torch.distributed as torch_dist
from mmengine.dist import get_world_size

Tensor = torch.Tensor


def finite_flags(tensors: Sequence[Tensor]) -> Tuple[Tensor, List[int]]:
    """Whether each tensor is all finite, in one multi-tensor kernel per dtype.

    Args:
        tensors (list[Tensor]): floating-point tensors of any shapes and dtypes.

    Returns:
        tuple: ``flags``, a (len(tensors),) bool tensor on the first tensor's
        device, and ``order``, the list of tensor indices: ``flags[k]`` is True
        when ``tensors[order[k]]`` holds neither NaN nor infinity (tensors are
        grouped by device and dtype; one group keeps the input order).
    """
    if not tensors:
        return torch.ones(0, dtype=torch.bool), []
    groups: Dict[Tuple[torch.device, torch.dtype], List[int]] = {}
    empty = [i for i, t in enumerate(tensors) if t.numel() == 0]  # finite, no norm
    for i, t in enumerate(tensors):
        if t.numel():
            groups.setdefault((t.device, t.dtype), []).append(i)
    device = tensors[0].device
    flags, order = [torch.ones(len(empty), dtype=torch.bool, device=device)], empty
    for index in groups.values():
        # the infinity norm: NaN if any element is NaN, inf if any is infinite
        # (and none NaN), never an overflow of finite values
        norms = torch._foreach_norm([tensors[i] for i in index], float('inf'))
        flags.append(torch.isfinite(torch.stack(norms)).to(device))
        order = order + index
    return torch.cat(flags), order


def floating(named: Iterable[Tuple[str, object]]) -> List[Tuple[str, Tensor]]:
    """The floating-point tensors of ``(name, value)`` pairs, in order."""
    return [(name, t) for name, t in named
            if torch.is_tensor(t) and t.is_floating_point()]


def any_rank(flag: Tensor) -> bool:
    """Read ``flag`` (a bool scalar tensor): whether it is set on any process.

    One device read; in a distributed run, one all-reduce before it, so that all
    processes take the same branch.
    """
    if get_world_size() > 1 and torch_dist.is_initialized():
        count = flag.to(torch.int32)
        torch_dist.all_reduce(count)
        return bool(count.item())
    return bool(flag.item())


def non_finite(named: Iterable[Tuple[str, object]], distributed: bool = False
               ) -> List[str]:
    """The names of the floating-point tensors with a NaN or an infinity.

    Args:
        named (iterable): ``(name, value)`` pairs (a ``state_dict().items()``);
            non-tensor and integer values are skipped.
        distributed (bool): a collective call, True on every process or on none:
            if any process finds a non-finite tensor, every process gets a
            non-empty list (its own offenders, or ``['(on another process)']``).
            Defaults to False.

    Returns:
        list[str]: the offenders' names in order; empty if all are finite.
    """
    pairs = floating(named)
    if not pairs:  # nothing to check (the same on every process)
        return []
    flags, order = finite_flags([t for _, t in pairs])
    flag = ~flags.all()
    found = any_rank(flag) if distributed else bool(flag.item())
    if not found:
        return []
    bad = sorted(i for i, ok in zip(order, flags.tolist()) if not ok)
    return [pairs[i][0] for i in bad] or ['(on another process)']
