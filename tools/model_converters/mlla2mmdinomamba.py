"""Convert an official MLLA checkpoint (github LeapLabTHU/MLLA) for mmpretrain.

The output holds ``state_dict`` with the keys of an mmpretrain ``ImageClassifier``
whose backbone is our ``MLLA``, neck ``GlobalAveragePooling`` and head
``LinearClsHead`` (``backbone.*``, ``head.fc.*``); the resolution-bound
``rotations`` buffers are dropped. The official file may hold its weights under
``model`` (default), ``state_dict_ema`` (``--ema``) or be a bare state dict; the
tool says which it used. A checkpoint of another layout fails, naming the keys
that do not match. Usage::

    python tools/model_converters/mlla2mmdinomamba.py mlla_t.pth mlla-t_in1k.pth

then ``load_from='mlla-t_in1k.pth'`` in a classification config (see
docs/mlla.md), or ``init_cfg=dict(type='Pretrained', checkpoint=...)`` on the
backbone, which also takes the official file as it is.
"""
import argparse

__all__ = ['convert', 'main']


def convert(state: dict) -> dict:
    """:func:`mmdinomamba.models.backbones.mlla_official.convert` (imported on use,
    so that ``--help`` answers without loading torch)."""
    from mmdinomamba.models.backbones.mlla_official import convert as to_ours
    return to_ours(state)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official MLLA checkpoint')
    parser.add_argument('dst', help='output checkpoint for mmpretrain')
    parser.add_argument('--ema', action='store_true',
                        help='convert state_dict_ema (the model EMA) instead of model')
    args = parser.parse_args(argv)
    from mmdinomamba.models.backbones.mlla_official import official_weights, read_arch
    from mmdinomamba.models.checkpoint import check_finite
    from mmdinomamba.utils import (UnsafeCheckpointError, load_official_checkpoint,
                                   save_atomic)
    try:
        weights, source = official_weights(load_official_checkpoint(args.src),
                                           args.ema)
        state = convert(weights)
        check_finite(weights, f'{source!r} weights')  # nothing written if not
    except (FileNotFoundError, ValueError, UnsafeCheckpointError) as err:
        parser.error(f'{args.src}: {err}')
    arch = read_arch(weights)
    save_atomic(dict(state_dict=state, meta=dict(converted_from=args.src,
                                                 weights=source, **arch)), args.dst)
    print(f'{args.src}: converted {source!r} ({len(state)} tensors; embed_dims '
          f"{arch['embed_dims']}, depths {arch['depths']}, "
          f"{arch['num_classes']} classes) to {args.dst}")


if __name__ == '__main__':
    main()
