"""``tests/ops/interpret/`` runs under ``TRITON_INTERPRET=1`` only, in a process of
its own (``test_triton_interpreter.py``): it is collected there, not here."""
import os

import pytest
import torch

collect_ignore = [] if os.environ.get('TRITON_INTERPRET') == '1' else ['interpret']


@pytest.fixture
def no_tf32():
    """IEEE float32 matmuls and convolutions for the test (TF32 off), restored after:
    the GPU twin tests compare fused kernels with PyTorch at float32 tolerances."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
