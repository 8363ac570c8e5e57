"""Pure PyTorch kernels: the SSD scan (with its slow twin and mixing matrix) and norms."""
from .norm import RMSNorm, gated_rms_norm, rms_norm
from .ssd import (BACKENDS, check_ssd_inputs, discretize_dt, mamba_ssm_available,
                  resolve_backend, segsum, ssd, ssd_chunked, ssd_mixing_matrix,
                  ssd_quadratic, ssd_ref)

__all__ = [
    'BACKENDS', 'RMSNorm', 'check_ssd_inputs', 'discretize_dt', 'gated_rms_norm',
    'mamba_ssm_available', 'resolve_backend', 'rms_norm', 'segsum', 'ssd',
    'ssd_chunked', 'ssd_mixing_matrix', 'ssd_quadratic', 'ssd_ref'
]
