"""Convert an official Dino-Mamba checkpoint into a DinoVim backbone state dict.

Sources (github yangtiming/Dino-Mamba):
- a DINO training checkpoint (``checkpoint.pth``) with ``student`` / ``teacher``
  dicts whose keys start with ``module.backbone.`` (the projection head,
  ``module.head.*``, is dropped);
- a plain backbone state dict (optionally under ``model`` or ``state_dict``),
  whose classifier ``head.*`` is dropped.

Parameter names already match :class:`mmdinomamba.models.DinoVim`, so the
conversion only unwraps and filters. Usage::

    python tools/model_converters/dinomamba2mmdinomamba.py checkpoint.pth out.pth [--student]

then ``init_cfg=dict(type='Pretrained', checkpoint='out.pth')`` on the backbone.
"""
import argparse
import os.path as osp
from collections import OrderedDict
from typing import Dict

import torch

WRAPPER_PREFIXES = ('module.', 'backbone.')


def convert(checkpoint: Dict, branch: str = 'teacher') -> 'OrderedDict[str, torch.Tensor]':
    """Official checkpoint (dict as loaded by torch.load) -> DinoVim state dict.

    Args:
        checkpoint (dict): the loaded file.
        branch (str): 'teacher' or 'student' for DINO checkpoints.

    Returns:
        OrderedDict: backbone parameters with DinoVim's names.
    """
    if branch not in ('teacher', 'student'):
        raise ValueError(f"branch must be 'teacher' or 'student', got {branch!r}")
    if 'teacher' in checkpoint or 'student' in checkpoint:
        if branch not in checkpoint:
            raise KeyError(f'DINO checkpoint has no {branch!r} weights '
                           f'(keys: {sorted(checkpoint)[:10]})')
        state = checkpoint[branch]
        is_dino = True
    else:
        state = checkpoint.get('model', checkpoint.get('state_dict', checkpoint))
        is_dino = False
    out = OrderedDict()
    for key, value in state.items():
        if not torch.is_tensor(value):
            continue
        name = key
        if name.startswith('module.'):
            name = name[len('module.'):]
        if is_dino:
            if not name.startswith('backbone.'):
                continue  # the DINO projection head
            name = name[len('backbone.'):]
        if name.startswith('head.'):
            continue  # classifier of a plain backbone
        out[name] = value
    if not out:
        raise ValueError('no backbone parameters found in the checkpoint')
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official checkpoint')
    parser.add_argument('dst', help='output backbone state dict')
    parser.add_argument('--student', action='store_true',
                        help='take the student weights of a DINO checkpoint '
                        '(default: teacher)')
    args = parser.parse_args()
    if not osp.isfile(args.src):
        raise FileNotFoundError(f'checkpoint not found: {args.src}')
    from mmdinomamba.engine import save_atomic
    state = convert(torch.load(args.src, map_location='cpu', weights_only=False),
                    'student' if args.student else 'teacher')
    save_atomic(state, args.dst)
    print(f'{len(state)} tensors written to {args.dst}')


if __name__ == '__main__':
    main()
