"""The Triton kernels' arithmetic on the CPU, through Triton's interpreter, and the
forward scan's choice of segments.

``TRITON_INTERPRET=1`` runs every kernel with NumPy, so the kernels' math is
checked without a GPU. Triton reads the variable when the kernels are defined, at
import, so ``tests/ops/interpret/`` (not collected in this process: see
``tests/ops/conftest.py``) runs in a pytest process of its own with it set, one
module per test here.
"""
import os
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip('triton')

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
INTERPRETED = ('test_kernels.py', 'test_mixer_op.py', 'test_blocks.py',
               'test_mlla_kernels.py', 'test_layer_norm_kernels.py')


@pytest.mark.slow
@pytest.mark.parametrize('module', INTERPRETED)
def test_under_the_interpreter(module):
    env = dict(os.environ, TRITON_INTERPRET='1',
               PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
         osp.join('tests', 'ops', 'interpret', module)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert ' passed' in proc.stdout and 'skipped' not in proc.stdout, proc.stdout[-2000:]


def test_forward_segments_only_for_long_sequences_at_small_batches(monkeypatch):
    """default_segments: one segment for training batches and for 1024 px at batch
    4 (their grids hold more than one program per multiprocessor), more at batch 1,
    never one of fewer than 8 chunks."""
    from mmdinomamba.ops.triton import ssd_fwd
    monkeypatch.setattr(ssd_fwd, 'sm_count', lambda device: 132)

    def segments(batch, nslots, nchunks, p_blocks=1):
        args = SimpleNamespace(batch=batch, nslots=nslots, nchunks=nchunks,
                               x=SimpleNamespace(device=torch.device('cuda')))
        return ssd_fwd.default_segments(args, p_blocks)

    assert segments(128, 48, 7) == 1  # DinoVim-B, 224 px, batch 128
    assert segments(4, 48, 129) == 1  # 1024 px, batch 4: 192 programs
    assert segments(1, 48, 129) == 4  # batch 1: 48 programs -> 192 (<= 2 x 132)
    assert segments(1, 48, 129, p_blocks=4) == 1  # channel blocks count as programs
    assert segments(1, 48, 15) == 1  # two segments of 15 chunks: 7.5 < 8 each
    assert segments(1, 48, 24) == 2  # 2 of 12 chunks; 4 of 6 would be too short
