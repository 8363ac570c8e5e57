"""Extract the backbone of an mmdinomamba DINO pretraining checkpoint.

The checkpoint written by ``tools/train.py configs/dino/...`` holds the whole
:class:`mmdinomamba.models.selfsup.DINO`: the student (``backbone.*``,
``head.*``), the EMA teacher (``teacher.backbone.*``, ``teacher.head.*``) and the
loss centre. The teacher backbone is the one to evaluate (as in the paper).
Usage::

    python tools/model_converters/extract_teacher.py CKPT OUT [--student]

then ``init_cfg=dict(type='Pretrained', checkpoint=OUT)`` on the backbone of a
linear-probe, UperNet or Cascade Mask R-CNN config. (For the official Dino-Mamba
checkpoints use ``dinomamba2mmdinomamba.py`` instead.)
"""
import argparse
import os.path as osp
from collections import OrderedDict
from typing import Dict

import torch

PREFIXES = {'teacher': 'teacher.backbone.', 'student': 'backbone.'}


def convert(state_dict: Dict[str, torch.Tensor],
            branch: str = 'teacher') -> 'OrderedDict[str, torch.Tensor]':
    """DINO model state dict -> backbone state dict of ``branch``.

    Args:
        state_dict (dict): the ``state_dict`` of a DINO checkpoint.
        branch (str): 'teacher' or 'student'. Defaults to 'teacher'.

    Returns:
        OrderedDict: the branch's backbone tensors, prefix stripped.
    """
    if branch not in PREFIXES:
        raise ValueError(f"branch must be one of {sorted(PREFIXES)}, got {branch!r}")
    prefix = PREFIXES[branch]
    out = OrderedDict((key[len(prefix):], value) for key, value in state_dict.items()
                      if key.startswith(prefix))
    if not out:
        raise ValueError(f'no `{prefix}*` tensors in the state dict: not a DINO '
                         f'checkpoint? (first keys: {list(state_dict)[:5]})')
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description='Extract the teacher (or student) '
                                     'backbone of a DINO pretraining checkpoint')
    parser.add_argument('checkpoint', help='DINO checkpoint from tools/train.py')
    parser.add_argument('out', help='output backbone checkpoint')
    parser.add_argument('--student', action='store_true',
                        help='extract the student instead of the teacher')
    args = parser.parse_args(argv)
    if not osp.isfile(args.checkpoint):
        parser.error(f'checkpoint not found: {args.checkpoint}')

    from mmdinomamba.engine import (UnsafeCheckpointError, load_checkpoint_file,
                                    save_atomic)
    try:
        ckpt = load_checkpoint_file(args.checkpoint, map_location='cpu')
    except (UnsafeCheckpointError, ValueError) as err:
        parser.error(str(err))
    if not isinstance(ckpt, dict):
        parser.error(f'{args.checkpoint}: a checkpoint must be a dict, got '
                     f'{type(ckpt).__name__}')
    branch = 'student' if args.student else 'teacher'
    try:
        state = convert(ckpt.get('state_dict', ckpt), branch)
    except ValueError as err:
        parser.error(f'{args.checkpoint}: {err}')
    meta = dict(source=osp.abspath(args.checkpoint), branch=branch)
    for key in ('epoch', 'iter'):
        if key in ckpt.get('meta', {}):
            meta[key] = ckpt['meta'][key]
    save_atomic(dict(state_dict=state, meta=meta), args.out)
    print(f'{branch} backbone: {len(state)} tensors written to {args.out}')


if __name__ == '__main__':
    main()
