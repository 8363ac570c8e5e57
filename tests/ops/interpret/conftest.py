"""These tests run only under ``TRITON_INTERPRET=1``, which Triton reads when the
kernels are defined (at import): ``tests/ops/test_triton_interpreter.py`` runs
this folder in a pytest process of its own with it set."""
import os

import pytest

if os.environ.get('TRITON_INTERPRET') != '1':
    raise pytest.UsageError('tests/ops/interpret/ needs TRITON_INTERPRET=1 (run it '
                            'through tests/ops/test_triton_interpreter.py)')
pytest.importorskip('triton')
