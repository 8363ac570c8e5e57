"""Triton kernels for the SSD scan and the layers around it, and for MLLA's
attention (CUDA only).

Importing this package imports Triton; use
:func:`mmdinomamba.ops.backend.triton_available` to ask first. Of the rest of
:mod:`mmdinomamba.ops` it imports the contracts of :mod:`mmdinomamba.ops.spec` alone.
Every kernel has a PyTorch twin in :mod:`mmdinomamba.ops` with the same arguments,
the ground truth in the tests. Split by stage, as the algorithm runs:

=================  ==============================================================
``ssd_common.py``  the scan's layout, jit helpers and tile sizes
``ssd_fwd.py``     the scan's forward kernel
``ssd_bwd.py``     the scan's backward kernels (state sweeps, then every chunk)
``ssd_scan.py``    the scan as an autograd op: :func:`ssd_triton`
``conv.py``        both directions' causal conv + SiLU
``norm.py``        gated RMSNorm + direction average; residual add + RMSNorm
``layer_norm.py``  residual add + LayerNorm: :func:`add_layer_norm_triton`
``mixer.py``       the mixer after ``in_proj``: :func:`mixer_core_triton`
``blocks.py``      a stack of blocks as one autograd node: :func:`blocks_triton`
``mlla.py``        MLLA's feature map + RoPE, and its output with LePE
=================  ==============================================================
"""
from .blocks import blocks_triton
from .layer_norm import add_layer_norm_triton
from .mixer import mixer_core_triton
from .mlla import mlla_features_triton, mlla_output_triton
from .norm import add_rms_norm_triton
from .ssd_scan import ssd_triton

__all__ = ['add_layer_norm_triton', 'add_rms_norm_triton', 'blocks_triton',
           'mixer_core_triton', 'mlla_features_triton', 'mlla_output_triton',
           'ssd_triton']
