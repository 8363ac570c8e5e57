"""Triton kernels for the SSD scan and the layers around it (CUDA only).

Importing this package imports Triton; use :func:`mmdinomamba.ops.fused.triton_available`
to ask first. Every kernel has a PyTorch twin in :mod:`mmdinomamba.ops` that is the
ground truth in the tests.
"""
from .mixer import ssd_mixer_core
from .norm import add_rms_norm_triton
from .ssd_scan import ssd_triton

__all__ = ['add_rms_norm_triton', 'ssd_mixer_core', 'ssd_triton']
