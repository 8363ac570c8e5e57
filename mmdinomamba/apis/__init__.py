"""The upstream inferencers, with DinoVim's and MLLA's blocks replayed from CUDA
graphs when the model is on a GPU.

``mmdinomamba.apis.ImageClassificationInferencer`` and ``FeatureExtractor``
(mmpretrain's), ``MMSegInferencer`` (mmseg's) and ``DetInferencer`` (mmdet's) take
what the upstream class takes, and three keywords more:

- ``cuda_graphs`` (bool): replay the backbone's blocks from CUDA graphs when the
  model is on CUDA (:func:`mmdinomamba.engine.graph_blocks` with
  ``training=False``); False runs them eagerly, as the upstream class does.
  Defaults to True. On a CPU nothing changes.
- ``max_signatures`` (int): graphs kept per block stack (MLLA: per stage), least
  recently used first out. Defaults to 16.
- ``capture_after`` (int): calls of an input size before it is captured (the
  first ones run eagerly: sizes seen once cost no capture). Defaults to 2.

One graph is captured per input signature (batch, size, dtype, the blocks whose
outputs the model asks for); the numbers are the eager ones (the same kernels).
Each class is built from the upstream one on first use, so only the package it
wraps must be installed::

    from mmdinomamba.apis import MMSegInferencer
    seg = MMSegInferencer(model=CONFIG, weights=CKPT, device='cuda')
    seg = MMSegInferencer(model=CONFIG, weights=CKPT, cuda_graphs=False)  # eager
"""
import importlib
from typing import List

import torch.nn as nn

from mmdinomamba.engine.graphed_blocks import graph_blocks, on_cuda
from mmdinomamba.engine.hooks.cuda_graph_hook import (TEST_CAPTURE_AFTER,
                                                      TEST_MAX_SIGNATURES)

# our name -> the upstream module that has the class of that name
UPSTREAM = {'ImageClassificationInferencer': 'mmpretrain.apis',
            'FeatureExtractor': 'mmpretrain.apis',
            'MMSegInferencer': 'mmseg.apis',
            'DetInferencer': 'mmdet.apis'}

__all__ = ['graph_inference', *UPSTREAM]


def graph_inference(model: nn.Module, cuda_graphs: bool = True,
                    max_signatures: int = TEST_MAX_SIGNATURES,
                    capture_after: int = TEST_CAPTURE_AFTER) -> List[str]:
    """Set ``model``'s backbones to replay their no-grad forward from CUDA graphs
    when it is on CUDA and ``cuda_graphs`` is on; return the names of the modules
    set (none on a CPU, or when off)."""
    if not cuda_graphs or not on_cuda(model):
        return []
    return graph_blocks(model, training=False, max_signatures=max_signatures,
                        capture_after=capture_after)


def _graphed_class(name: str) -> type:
    upstream = getattr(importlib.import_module(UPSTREAM[name]), name)

    def __init__(self, *args, cuda_graphs: bool = True,
                 max_signatures: int = TEST_MAX_SIGNATURES,
                 capture_after: int = TEST_CAPTURE_AFTER, **kwargs):
        upstream.__init__(self, *args, **kwargs)
        #: the modules whose blocks replay from CUDA graphs ('' for the model)
        self.graphed_modules = graph_inference(self.model, cuda_graphs,
                                               max_signatures, capture_after)

    doc = (f'``{upstream.__module__}.{name}``, with the backbone\'s blocks replayed '
           'from CUDA graphs on a GPU (keywords ``cuda_graphs``, ``max_signatures``, '
           f'``capture_after``: see :mod:`{__name__}`).')
    return type(name, (upstream, ), dict(__init__=__init__, __doc__=doc,
                                         __module__=__name__))


def __getattr__(name: str):
    if name in UPSTREAM:
        cls = globals()[name] = _graphed_class(name)
        return cls
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
