"""Official MLLA checkpoints (github LeapLabTHU/MLLA) -> our MLLA classifier.

An official file is a dict with the weights under ``model`` (and, when trained
with EMA, ``state_dict_ema``) next to training state, or a bare state dict
(``state_dict`` is also read). Its
keys are those of the official ``MLLA`` class (``patch_embed.*``,
``layers.{i}.blocks.{j}.*``, ``layers.{i}.downsample.*``, ``norm.*``, ``head.*``)
plus one resolution-bound ``layers.{i}.blocks.{j}.attn.rope.rotations`` buffer per
block. :func:`convert` maps every tensor to exactly one key of an mmpretrain
``ImageClassifier`` with our :class:`~mmdinomamba.models.backbones.MLLA` backbone,
global average pooling and a ``LinearClsHead``:

=====================================  =========================================
official                               ours
=====================================  =========================================
``patch_embed.*``, ``layers.*``        ``backbone.`` + the same name
``norm.*`` (the final LayerNorm)       ``backbone.norm3.*`` (the last stage's
                                       output norm)
``head.*``                             ``head.fc.*``
``*.attn.rope.rotations``              dropped (RoPE is computed per input)
=====================================  =========================================

Before mapping, the layout is checked against the one the official class builds
for the widths, depths and MLP ratio read off the tensors (every key and every
shape); a foreign or damaged checkpoint fails naming the keys that do not match.
The head count is not stored in any shape: it comes from the config.
"""
import os.path as osp
import pickle
import re
from collections import OrderedDict
from typing import Dict, List, Tuple

import torch

Tensor = torch.Tensor

WEIGHT_KEYS = ('model', 'state_dict_ema', 'state_dict')  # in order of preference
ROTATIONS = '.attn.rope.rotations'
NUM_STAGES = 4
_BLOCK = re.compile(r'^layers\.(\d+)\.blocks\.(\d+)\.')

__all__ = ['convert', 'is_official', 'load_checkpoint_file', 'official_layout',
           'official_weights', 'read_arch']


def load_checkpoint_file(path: str):
    """The one place an official MLLA file is read (tensors and plain types only).

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ValueError: the file holds objects other than tensors and plain types.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'MLLA checkpoint {path!r} does not exist')
    try:
        return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f'{path}: not readable as tensors and plain types '
                         f'(weights_only=True): {str(err).splitlines()[0]}') from None


def official_weights(checkpoint, ema: bool = False) -> Tuple[Dict[str, Tensor], str]:
    """The state dict inside an official file, and where it was found.

    Args:
        checkpoint (dict): the loaded file.
        ema (bool): take ``state_dict_ema`` (the model EMA). Otherwise the first
            of ``model``, ``state_dict_ema``, ``state_dict`` that the file has, or
            the file itself (a bare state dict). Defaults to False.

    Returns:
        tuple: (name -> tensor, where: ``'model'``, ``'state_dict_ema'``,
        ``'state_dict'`` or ``'bare state dict'``).
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f'an MLLA checkpoint must be a dict, got '
                         f'{type(checkpoint).__name__}')
    present = [k for k in WEIGHT_KEYS if isinstance(checkpoint.get(k), dict)]
    if ema and 'state_dict_ema' not in present:
        raise ValueError(f'the checkpoint has no state_dict_ema (it holds '
                         f'{present or "a bare state dict"}); convert without --ema')
    source = 'state_dict_ema' if ema else (present[0] if present else
                                           'bare state dict')
    state = checkpoint[source] if present else checkpoint
    tensors = {k: v for k, v in state.items()
               if isinstance(k, str) and torch.is_tensor(v)}
    if tensors and all(k.startswith('module.') for k in tensors):
        tensors = {k[len('module.'):]: v for k, v in tensors.items()}
    return tensors, source


def is_official(state: Dict[str, Tensor]) -> bool:
    """Whether a state dict has the official key layout (not ours)."""
    return 'patch_embed.conv1.conv.weight' in state and 'norm.weight' in state


def read_arch(state: Dict[str, Tensor]) -> dict:
    """Widths, depths, MLP ratio and classes read off an official state dict.

    Returns:
        dict: ``embed_dims``, ``depths`` (list of 4), ``mlp_ratio``, ``num_classes``
        (0 without a head).

    Raises:
        ValueError: the tensors that fix these are missing or inconsistent.
    """
    stem = state.get('patch_embed.conv3.1.conv.weight')
    if stem is None or stem.dim() != 4:
        raise ValueError('not an official MLLA checkpoint: no patch_embed.conv3.1.conv.'
                         f'weight (the stem\'s last conv); keys start with '
                         f'{_some(list(state))}')
    depths = [0] * NUM_STAGES
    for key in state:
        match = _BLOCK.match(key)
        if match:
            stage, block = int(match.group(1)), int(match.group(2))
            if stage >= NUM_STAGES:
                raise ValueError(f'not an official MLLA checkpoint: {key} (MLLA has '
                                 f'{NUM_STAGES} stages)')
            depths[stage] = max(depths[stage], block + 1)
    if 0 in depths:
        raise ValueError(f'not an official MLLA checkpoint: blocks per stage {depths} '
                         '(every stage needs layers.{i}.blocks.0)')
    fc1 = state.get('layers.0.blocks.0.mlp.fc1.weight')
    embed_dims = int(stem.shape[0])
    if fc1 is None or fc1.shape[1] != embed_dims:
        raise ValueError('not an official MLLA checkpoint: layers.0.blocks.0.mlp.fc1.'
                         f'weight is {None if fc1 is None else tuple(fc1.shape)}, '
                         f'expected (hidden, {embed_dims})')
    head = state.get('head.weight')
    return dict(embed_dims=embed_dims, depths=depths,
                mlp_ratio=fc1.shape[0] / embed_dims,
                num_classes=0 if head is None else int(head.shape[0]))


def _conv(prefix: str, c_out: int, c_in: int, k: int, bias: bool, norm: bool,
          out: dict) -> None:
    out[f'{prefix}.conv.weight'] = (c_out, c_in, k, k)
    if bias:
        out[f'{prefix}.conv.bias'] = (c_out, )
    if norm:
        for name in ('weight', 'bias', 'running_mean', 'running_var'):
            out[f'{prefix}.norm.{name}'] = (c_out, )
        out[f'{prefix}.norm.num_batches_tracked'] = ()


def official_layout(embed_dims: int, depths: List[int], mlp_ratio: float = 4.0,
                    num_classes: int = 1000) -> 'OrderedDict[str, tuple]':
    """Every key and shape of the official ``MLLA(...).state_dict()``, without the
    ``rotations`` buffers (whose shape depends on the resolution).

    Returns:
        OrderedDict: key -> shape.
    """
    c = embed_dims
    out: 'OrderedDict[str, tuple]' = OrderedDict()
    _conv('patch_embed.conv1', c // 2, 3, 3, False, True, out)
    _conv('patch_embed.conv2.0', c // 2, c // 2, 3, False, True, out)
    _conv('patch_embed.conv2.1', c // 2, c // 2, 3, False, True, out)
    _conv('patch_embed.conv3.0', 4 * c, c // 2, 3, False, True, out)
    _conv('patch_embed.conv3.1', c, 4 * c, 1, False, True, out)
    for i, depth in enumerate(depths):
        dim = c * 2 ** i
        hidden = int(dim * mlp_ratio)
        for j in range(depth):
            p = f'layers.{i}.blocks.{j}.'
            for name, shape in (
                    ('cpe1.weight', (dim, 1, 3, 3)), ('cpe1.bias', (dim, )),
                    ('norm1.weight', (dim, )), ('norm1.bias', (dim, )),
                    ('in_proj.weight', (dim, dim)), ('in_proj.bias', (dim, )),
                    ('act_proj.weight', (dim, dim)), ('act_proj.bias', (dim, )),
                    ('dwc.weight', (dim, 1, 3, 3)), ('dwc.bias', (dim, )),
                    ('attn.qk.weight', (2 * dim, dim)), ('attn.qk.bias', (2 * dim, )),
                    ('attn.lepe.weight', (dim, 1, 3, 3)), ('attn.lepe.bias', (dim, )),
                    ('out_proj.weight', (dim, dim)), ('out_proj.bias', (dim, )),
                    ('cpe2.weight', (dim, 1, 3, 3)), ('cpe2.bias', (dim, )),
                    ('norm2.weight', (dim, )), ('norm2.bias', (dim, )),
                    ('mlp.fc1.weight', (hidden, dim)), ('mlp.fc1.bias', (hidden, )),
                    ('mlp.fc2.weight', (dim, hidden)), ('mlp.fc2.bias', (dim, ))):
                out[p + name] = shape
        if i < len(depths) - 1:
            wide = 8 * dim
            p = f'layers.{i}.downsample.conv.'
            _conv(p + '0', wide, dim, 1, True, False, out)
            _conv(p + '1', wide, 1, 3, True, False, out)
            _conv(p + '2', 2 * dim, wide, 1, True, True, out)
    last = c * 2 ** (len(depths) - 1)
    out['norm.weight'] = out['norm.bias'] = (last, )
    if num_classes:
        out['head.weight'] = (num_classes, last)
        out['head.bias'] = (num_classes, )
    return out


def _some(keys: List[str], limit: int = 6) -> str:
    keys = sorted(keys)
    more = f' and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def _rename(key: str) -> str:
    if key.startswith('norm.'):
        return f'backbone.norm{NUM_STAGES - 1}.' + key[len('norm.'):]
    if key.startswith('head.'):
        return 'head.fc.' + key[len('head.'):]
    return 'backbone.' + key


def convert(state: Dict[str, Tensor]) -> 'OrderedDict[str, Tensor]':
    """Official MLLA state dict -> mmpretrain ImageClassifier state dict.

    Args:
        state (dict): the official weights (``checkpoint['model']``, or
            ``['state_dict_ema']``, or a bare state dict), with or without the
            ``rotations`` buffers.

    Returns:
        OrderedDict: ``backbone.*`` and ``head.fc.*`` tensors (see the module
        docstring), in the official order.

    Raises:
        ValueError: naming every missing, unexpected or misshapen key.
    """
    weights = {k: v for k, v in state.items() if not k.endswith(ROTATIONS)}
    arch = read_arch(weights)
    expected = official_layout(**arch)
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    shapes = [f'{k} {tuple(weights[k].shape)}, expected {expected[k]}'
              for k in expected
              if k in weights and tuple(weights[k].shape) != expected[k]]
    problems = []
    if missing:
        problems.append(f'{len(missing)} missing keys: {_some(missing)}')
    if unexpected:
        problems.append(f'{len(unexpected)} unexpected keys: {_some(unexpected)}')
    if shapes:
        problems.append(f'{len(shapes)} tensors of the wrong shape: {_some(shapes)}')
    if problems:
        raise ValueError(f'not an official MLLA checkpoint (embed_dims '
                         f"{arch['embed_dims']}, depths {arch['depths']}): " +
                         '; '.join(problems))
    return OrderedDict((_rename(k), weights[k]) for k in expected)
