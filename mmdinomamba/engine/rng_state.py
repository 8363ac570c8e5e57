"""The random-number-generator states of a training process, for exact resume.

A resumed run repeats an uninterrupted one bit for bit only if every generator that
training draws from continues where it stopped: drop-path masks come from torch's
CPU (or the current CUDA device's) generator, and augmentations run in the main
process (``num_workers=0``) draw from Python's ``random`` and numpy's global
generator. What needs no saving: mmengine's ``DefaultSampler`` shuffles with a
fresh generator seeded by ``seed + epoch``, ``InfiniteSampler`` is replayed by
mmengine's iteration-based loop, and non-persistent data workers are re-seeded by
mmengine's ``worker_init_fn`` from the seed, rank and worker id every epoch (the
base seed torch draws for them comes from the restored torch generator).

The states are plain tensors, ints and tuples, so checkpoints holding them still
load with ``torch.load(weights_only=True)``.
"""
import logging
import os
import random
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_world_size
from mmengine.logging import print_log


def get_rng_state() -> Dict[str, Any]:
    """This process's generator states: Python, numpy, torch CPU and current CUDA device.

    Returns:
        dict: ``python`` (``random.getstate()``), ``numpy`` (a dict with the
        MT19937 ``key`` as an int64 tensor of 624, ``pos``, ``has_gauss``,
        ``gauss``), ``torch`` (a uint8 tensor) and, when CUDA is initialised,
        ``cuda`` (the current device's uint8 tensor).
    """
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    if name != 'MT19937':
        raise RuntimeError(f'numpy\'s global generator is {name}, expected MT19937')
    state = dict(python=random.getstate(),
                 numpy=dict(key=torch.from_numpy(key.astype(np.int64)), pos=int(pos),
                            has_gauss=int(has_gauss), gauss=float(gauss)),
                 torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore the states returned by :func:`get_rng_state`.

    A CUDA state without CUDA here, or CUDA in use without a CUDA state (a run
    moved between the CPU and a GPU), is logged: the run then continues with
    other drop-path masks than an uninterrupted one.

    Raises:
        ValueError: if the state misses one of the CPU generators.
    """
    missing = {'python', 'numpy', 'torch'} - set(state)
    if missing:
        raise ValueError(f'RNG state lacks {sorted(missing)}; it has {sorted(state)}')
    cuda_here = torch.cuda.is_available() and torch.cuda.is_initialized()
    if ('cuda' in state) != cuda_here:
        saved = 'holds' if 'cuda' in state else 'lacks'
        here = 'is' if cuda_here else 'is not'
        print_log(f'RNG state: it {saved} a CUDA generator state and CUDA {here} in '
                  'use here; the CUDA generator is not restored', logger='current',
                  level=logging.WARNING)
    random.setstate(state['python'])
    numpy = state['numpy']
    np.random.set_state(('MT19937', numpy['key'].numpy().astype(np.uint32),
                         numpy['pos'], numpy['has_gauss'], numpy['gauss']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and cuda_here:
        torch.cuda.set_rng_state(state['cuda'])


def gather_rng_states(state: Optional[Dict[str, Any]] = None
                      ) -> List[Dict[str, Any]]:
    """Every rank's :func:`get_rng_state`, indexed by rank (a collective call).

    Args:
        state (dict, optional): this rank's state to gather instead of the
            current one (e.g. the training state saved before a validation).
            Defaults to None.

    Returns:
        list[dict]: one state per rank, ``world_size`` of them.
    """
    if state is None:
        state = get_rng_state()
    if get_world_size() == 1:
        return [state]
    return all_gather_object(state)


def epoch_worker_init_fn(worker_id: int) -> None:
    """Seed a data worker from the base seed torch drew for this epoch's workers.

    mmengine's default ``worker_init_fn`` seeds each worker with ``seed + rank *
    num_workers + worker_id``, the same every epoch, so non-persistent workers
    replay one stream of augmentation parameters epoch after epoch. torch gives
    worker ``w`` the seed ``base + w``, with ``base`` drawn from the main process's
    torch generator whenever an iterator starts (every epoch for non-persistent
    workers). Seeding numpy, ``random`` and torch from that seed and the rank
    gives every epoch and rank fresh augmentations, and since the main generator
    is checkpointed (:class:`~mmdinomamba.engine.ResumableCheckpointHook`), a
    resumed run's workers draw what the uninterrupted run's drew.

    Pass it as a ``DataLoader``'s ``worker_init_fn`` with
    ``persistent_workers=False``. The rank comes from the ``RANK`` environment
    variable (set by torchrun and mmengine's launchers).

    Args:
        worker_id (int): the worker's index (its seed already holds it).
    """
    rank = int(os.environ.get('RANK', 0))
    low, high = np.random.SeedSequence([torch.initial_seed(), rank]).generate_state(2)
    np.random.seed(low)
    random.seed(int(high))
    torch.manual_seed((int(high) << 32) | int(low))
