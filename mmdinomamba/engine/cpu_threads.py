"""Thread default for CPU runs.

DinoVim's CPU path issues thousands of small tensor operations per step; with more
than one intra-op thread each of them pays a synchronisation of the threads, and on a
busy machine that costs more than the threads give: DinoVim-T forward + backward at
128 px, batch 2, on a loaded 2-core machine took 0.9-1.0 s with one thread and 10-16 s
with two. So the tools run CPU jobs on one thread unless ``OMP_NUM_THREADS`` says
otherwise.
"""
import os
from typing import Mapping, Optional

import torch
from mmengine.logging import print_log


def default_cpu_threads(cuda: bool, env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The intra-op thread count a run should set: 1 for a CPU-only run without
    ``OMP_NUM_THREADS``, else None (leave torch's choice or the user's)."""
    if cuda or env.get('OMP_NUM_THREADS'):
        return None
    return 1


def setup_cpu_threads() -> None:
    """Apply :func:`default_cpu_threads` to this process, with a logged line."""
    threads = default_cpu_threads(torch.cuda.is_available())
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
        print_log(f'CPU run: {threads} intra-op thread (many small ops; set '
                  'OMP_NUM_THREADS to choose another count)', logger='current')
