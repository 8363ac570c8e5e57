"""Extract the backbone of an mmdinomamba DINO pretraining checkpoint.

The checkpoint written by ``tools/train.py configs/dino/...`` holds the whole
DINO model: student, EMA teacher and loss centre. The teacher backbone is the one
to evaluate (as in the paper). Usage::

    python tools/model_converters/extract_teacher.py CKPT OUT [--student]

then ``init_cfg=dict(type='Pretrained', checkpoint=OUT)`` on the backbone of a
linear-probe, UperNet or Cascade Mask R-CNN config. (For the official Dino-Mamba
checkpoints use ``dinomamba2mmdinomamba.py`` instead.) The work is
:func:`mmdinomamba.models.checkpoint.extract_dino_backbone`.
"""
import argparse


def main(argv=None):
    parser = argparse.ArgumentParser(description='Extract the teacher (or student) '
                                     'backbone of a DINO pretraining checkpoint')
    parser.add_argument('checkpoint', help='DINO checkpoint from tools/train.py')
    parser.add_argument('out', help='output backbone checkpoint')
    parser.add_argument('--student', action='store_true',
                        help='extract the student instead of the teacher')
    args = parser.parse_args(argv)
    from mmdinomamba.models.checkpoint import extract_dino_backbone
    from mmdinomamba.utils import UnsafeCheckpointError
    branch = 'student' if args.student else 'teacher'
    try:
        count = extract_dino_backbone(args.checkpoint, args.out, branch)
    except (FileNotFoundError, ValueError, UnsafeCheckpointError) as err:
        parser.error(str(err))
    print(f'{branch} backbone: {count} tensors written to {args.out}')


if __name__ == '__main__':
    main()
