"""Pure PyTorch kernels: the SSD scan (with its slow twin and mixing matrix) and norms.

Fused Triton kernels for CUDA live in :mod:`mmdinomamba.ops.triton`, imported
only on demand (:mod:`mmdinomamba.ops.fused` dispatches).
"""
from .fused import add_rms_norm, triton_available, use_triton
from .conv import causal_depthwise_conv1d
from .norm import RMSNorm, gated_rms_norm, rms_norm
from .mixer import (MixerParams, MixerSpec, direction_ssd_inputs, mixer_core,
                    mixer_core_ref, uses_fused_core)
from .blocks import BlockParams, BlockSpec, blocks, blocks_loop, uses_fused_blocks
from .ssd import (BACKENDS, check_finite, check_ssd_inputs, discretize_dt,
                  mamba_ssm_available, resolve_backend, segsum, ssd, ssd_chunked,
                  ssd_decay_mask, ssd_mixing_matrix, ssd_quadratic, ssd_ref)

__all__ = [
    'BACKENDS', 'BlockParams', 'BlockSpec', 'MixerParams', 'MixerSpec', 'RMSNorm',
    'add_rms_norm', 'blocks', 'blocks_loop', 'causal_depthwise_conv1d', 'check_finite',
    'check_ssd_inputs', 'direction_ssd_inputs', 'discretize_dt', 'gated_rms_norm',
    'mamba_ssm_available', 'mixer_core', 'mixer_core_ref', 'resolve_backend', 'rms_norm',
    'segsum', 'ssd', 'ssd_chunked', 'ssd_decay_mask', 'ssd_mixing_matrix',
    'ssd_quadratic', 'ssd_ref', 'triton_available', 'use_triton', 'uses_fused_blocks',
    'uses_fused_core'
]
