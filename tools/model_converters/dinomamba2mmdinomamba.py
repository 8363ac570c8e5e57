"""Convert an official Dino-Mamba checkpoint into a DinoVim backbone state dict.

Sources (github yangtiming/Dino-Mamba):
- a DINO training checkpoint (``checkpoint.pth``) with ``student`` / ``teacher``
  dicts whose keys start with ``module.backbone.`` (the projection head,
  ``module.head.*``, is dropped);
- a plain backbone state dict (optionally under ``model`` or ``state_dict``),
  whose classifier ``head.*`` is dropped.

Parameter names already match :class:`mmdinomamba.models.DinoVim`, so the
conversion unwraps and filters, then checks that the result has the official
layout (:func:`validate`: every required key, consistent shapes, blocks
``0 .. depth - 1``, nothing else) and fails naming what is wrong: a timm or
torchvision ViT, a dict of random tensors or an mmdinomamba DINO training
checkpoint (use ``extract_teacher.py`` for those) are refused. Usage::

    python tools/model_converters/dinomamba2mmdinomamba.py checkpoint.pth out.pth [--student]

then ``init_cfg=dict(type='Pretrained', checkpoint='out.pth')`` on the backbone.
The file is read by :func:`mmdinomamba.utils.load_official_checkpoint`: the
``args`` namespace of a DINO checkpoint becomes a plain dict and nothing in the
file is run; a file that holds other objects is refused, naming them.
"""
import argparse
import os.path as osp
import re
from collections import OrderedDict
from typing import Dict, List

WRAPPER_PREFIXES = ('module.', 'backbone.')
# the official layout (github yangtiming/Dino-Mamba, models_vim.py): keys outside the
# blocks, and per block i
GLOBAL_KEYS = ('patch_embed.proj.weight', 'patch_embed.proj.bias', 'pos_embed',
               'cls_token', 'norm_f.weight')
REGISTER_KEYS = ('pos_embed_cls', )
LAYER_KEYS = ('norm.weight', 'mixer.in_proj.weight', 'mixer.out_proj.weight',
              'mixer.conv1d.weight', 'mixer.conv1d.bias', 'mixer.conv1d_b.weight',
              'mixer.conv1d_b.bias', 'mixer.A_log', 'mixer.A_log_b', 'mixer.D',
              'mixer.D_b', 'mixer.dt_bias', 'mixer.dt_b_bias', 'mixer.norm.weight',
              'mixer.norm_b.weight')
OPTIONAL_LAYER_KEYS = ('mixer.in_proj.bias', 'mixer.out_proj.bias')
OWN_DINO_PREFIXES = ('teacher.backbone.', 'teacher.head.')
_LAYER = re.compile(r'^layers\.(\d+)\.(.+)$')


def _some(keys: List[str], limit: int = 8) -> str:
    keys = sorted(keys)
    more = f' and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def validate(state: Dict[str, 'torch.Tensor']) -> dict:
    """Check that ``state`` has the official Dino-Mamba backbone layout.

    Args:
        state (dict): a converted backbone state dict.

    Returns:
        dict: ``embed_dims``, ``num_layers``, ``num_registers`` (0 for the
        middle-[CLS] DinoVim), ``patch_size``.

    Raises:
        ValueError: naming the missing, unexpected and misshapen tensors.
    """
    layers: Dict[int, set] = {}
    unexpected = []
    for key in state:
        match = _LAYER.match(key)
        if match:
            layers.setdefault(int(match.group(1)), set()).add(match.group(2))
        elif key not in GLOBAL_KEYS + REGISTER_KEYS:
            unexpected.append(key)
    problems = []
    missing = [k for k in GLOBAL_KEYS if k not in state]
    if not layers:
        problems.append('no `layers.{i}.*` blocks')
    elif sorted(layers) != list(range(len(layers))):
        problems.append(f'blocks are not numbered 0..{len(layers) - 1}: found '
                        f'{sorted(layers)}')
    for i, names in sorted(layers.items()):
        missing += [f'layers.{i}.{k}' for k in LAYER_KEYS if k not in names]
        unexpected += [f'layers.{i}.{k}' for k in sorted(names)
                       if k not in LAYER_KEYS + OPTIONAL_LAYER_KEYS]
    if missing:
        problems.append(f'{len(missing)} required keys missing: {_some(missing)}')
    if unexpected:
        problems.append(f'{len(unexpected)} unexpected keys: {_some(unexpected)}')
    if problems:
        raise ValueError('not an official Dino-Mamba (DinoVim) backbone: ' +
                         '; '.join(problems))
    return _check_shapes(state, len(layers))


def _check_shapes(state: Dict[str, 'torch.Tensor'], depth: int) -> dict:
    """Shapes of the official layout, consistent over blocks (see :func:`validate`)."""
    bad = []

    def expect(key, shape):
        if tuple(state[key].shape) != tuple(shape):
            bad.append(f'{key} {tuple(state[key].shape)}, expected {tuple(shape)}')

    patch = state['patch_embed.proj.weight']
    if patch.dim() != 4 or patch.shape[2] != patch.shape[3]:
        raise ValueError(f'patch_embed.proj.weight must be (dim, channels, patch, '
                         f'patch), got {tuple(patch.shape)}')
    dim = patch.shape[0]
    expect('patch_embed.proj.bias', (dim, ))
    expect('norm_f.weight', (dim, ))
    cls = state['cls_token']
    registers = cls.shape[1] if cls.dim() == 3 and 'pos_embed_cls' in state else 0
    expect('cls_token', (1, max(registers, 1), dim))
    if registers:
        expect('pos_embed_cls', (1, registers, dim))
    pos = state['pos_embed']
    if pos.dim() != 3 or pos.shape[0] != 1 or pos.shape[2] != dim:
        bad.append(f'pos_embed {tuple(pos.shape)}, expected (1, slots, {dim})')
    first = {k: state[f'layers.0.mixer.{k}'].shape for k in
             ('in_proj.weight', 'out_proj.weight', 'conv1d.weight', 'A_log')}
    d_inner, nheads = first['out_proj.weight'][-1], first['A_log'][0]
    conv_dim = first['conv1d.weight'][0]
    if first['in_proj.weight'][0] != d_inner + conv_dim + nheads:
        bad.append(f'layers.0.mixer.in_proj.weight {tuple(first["in_proj.weight"])}: '
                   f'rows must be 2 * d_inner + 2 * ngroups * d_state + nheads = '
                   f'{d_inner + conv_dim + nheads}')
    for i in range(depth):
        p = f'layers.{i}.'
        expect(p + 'norm.weight', (dim, ))
        expect(p + 'mixer.in_proj.weight', (d_inner + conv_dim + nheads, dim))
        expect(p + 'mixer.out_proj.weight', (dim, d_inner))
        for name in ('conv1d', 'conv1d_b'):
            expect(p + f'mixer.{name}.weight', (conv_dim, 1, first['conv1d.weight'][2]))
            expect(p + f'mixer.{name}.bias', (conv_dim, ))
        for name in ('A_log', 'A_log_b', 'D', 'D_b', 'dt_bias', 'dt_b_bias'):
            expect(p + f'mixer.{name}', (nheads, ))
        for name in ('norm', 'norm_b'):
            expect(p + f'mixer.{name}.weight', (d_inner, ))
    if bad:
        raise ValueError(f'not an official Dino-Mamba (DinoVim) backbone: '
                         f'{len(bad)} tensors of the wrong shape: {_some(bad)}')
    return dict(embed_dims=int(dim), num_layers=depth, num_registers=int(registers),
                patch_size=int(patch.shape[2]))


def convert(checkpoint: Dict, branch: str = 'teacher') -> 'OrderedDict[str, torch.Tensor]':
    """Official checkpoint (dict as loaded by torch.load) -> DinoVim state dict.

    Args:
        checkpoint (dict): the loaded file.
        branch (str): 'teacher' or 'student' for DINO checkpoints.

    Returns:
        OrderedDict: backbone parameters with DinoVim's names.
    """
    import torch  # here, so that --help answers without loading it
    if branch not in ('teacher', 'student'):
        raise ValueError(f"branch must be 'teacher' or 'student', got {branch!r}")
    if not isinstance(checkpoint, dict):
        raise ValueError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    inner = checkpoint.get('state_dict')
    if isinstance(inner, dict) and any(k.startswith(OWN_DINO_PREFIXES) for k in inner):
        raise ValueError('this is an mmdinomamba DINO training checkpoint (its '
                         'state_dict holds backbone.* and teacher.backbone.* keys), '
                         'not an official one: use '
                         'tools/model_converters/extract_teacher.py instead')
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
    validate(out)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official checkpoint')
    parser.add_argument('dst', help='output backbone state dict')
    parser.add_argument('--student', action='store_true',
                        help='take the student weights of a DINO checkpoint '
                        '(default: teacher)')
    args = parser.parse_args(argv)
    if not osp.isfile(args.src):
        parser.error(f'checkpoint not found: {args.src}')
    from mmdinomamba.utils import (UnsafeCheckpointError, load_official_checkpoint,
                                   save_atomic)
    try:
        checkpoint = load_official_checkpoint(args.src)
    except (UnsafeCheckpointError, ValueError) as err:
        parser.error(str(err))
    from mmdinomamba.models.checkpoint import check_finite
    try:
        state = convert(checkpoint, 'student' if args.student else 'teacher')
        check_finite(state, args.src)  # nothing written for a diverged file
    except (KeyError, ValueError) as err:
        parser.error(f'{args.src}: {err}' if args.src not in str(err) else str(err))
    layout = validate(state)
    save_atomic(state, args.dst)
    print(f'{len(state)} tensors written to {args.dst} (DinoVim: embed_dims '
          f"{layout['embed_dims']}, {layout['num_layers']} blocks, "
          f"{layout['num_registers']} registers, patch {layout['patch_size']})")


if __name__ == '__main__':
    main()
