"""Pure PyTorch kernels (the SSD scan with its slow twin and mixing matrix, norms,
linear attention, MLLA's attention in :mod:`~mmdinomamba.ops.mlla`) and the choice of the fused Triton kernels for CUDA.

Inside, imports run one way (``tests/test_layering.py`` checks it)::

    blocks -> mixer -> backend -> {ssd, norm, conv, linear_attention} -> spec
    mlla -> backend
    triton -> spec

:mod:`~mmdinomamba.ops.spec` holds the contracts every implementation takes,
:mod:`~mmdinomamba.ops.backend` the rules that pick one, and the math modules the
PyTorch references; :mod:`mmdinomamba.ops.triton` (the fused kernels) is imported
only on demand, by the dispatchers.
"""
from .spec import (CHUNK_SIZE, TRITON_DTYPES, BlockParams, BlockSpec, MixerParams,
                   MixerSpec, at_least_float32, auto_chunk_size, check_chunk_size,
                   float32_or_wider, skip_kernels, split_projection)
from .conv import causal_depthwise_conv1d
from .norm import (RMSNorm, add_layer_norm_ref, add_rms_norm_ref, gated_rms_norm,
                   rms_norm)
from .ssd import (discretize_dt, segsum, ssd_chunked, ssd_decay_mask,
                  ssd_mixing_matrix, ssd_quadratic, ssd_ref)
from .backend import (BACKENDS, add_layer_norm, add_rms_norm, check_finite,
                      check_ssd_inputs, mamba_ssm_available, resolve_backend,
                      set_finite_checks, ssd_scan, triton_available, use_triton,
                      uses_fused_blocks, uses_fused_core)
from .mixer import direction_ssd_inputs, mixer_core, mixer_core_ref
from .blocks import blocks_loop, run_blocks

__all__ = [
    'BACKENDS', 'BlockParams', 'BlockSpec', 'CHUNK_SIZE', 'MixerParams', 'MixerSpec',
    'RMSNorm', 'auto_chunk_size', 'check_chunk_size',
    'TRITON_DTYPES', 'add_layer_norm', 'add_layer_norm_ref', 'add_rms_norm',
    'add_rms_norm_ref', 'at_least_float32',
    'blocks_loop', 'causal_depthwise_conv1d', 'check_finite', 'check_ssd_inputs',
    'direction_ssd_inputs', 'discretize_dt', 'float32_or_wider', 'gated_rms_norm',
    'mamba_ssm_available', 'mixer_core', 'mixer_core_ref', 'resolve_backend',
    'rms_norm', 'run_blocks', 'segsum', 'set_finite_checks', 'skip_kernels',
    'split_projection',
    'ssd_chunked', 'ssd_decay_mask', 'ssd_mixing_matrix', 'ssd_quadratic', 'ssd_ref',
    'ssd_scan', 'triton_available', 'use_triton', 'uses_fused_blocks', 'uses_fused_core'
]
