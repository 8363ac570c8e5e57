"""Time one SSD call of the 'quadratic' and 'chunked' backends against its length.

    python benchmarks/ssd_quadratic_length.py [--lengths 256 512 1024 2048 4096]
        [--heads 8] [--headdim 16] [--d-state 16] [--out FILE.csv]

One call (batch 1, one direction) at the toy DinoVim's mixer shape (8 heads of 16
channels, state 16: ``configs/_base_/models/dinovim-toy-p8.py``) on the CPU,
float32, the threads of ``OMP_NUM_THREADS``. 'quadratic' builds the seqlen x seqlen
mixing matrix of every head, so its time grows with the square of the length;
a backbone makes two such calls per block (both directions). This chose
``mmdinomamba.ops.backend.QUADRATIC_MAX_SEQLEN``.
"""
import argparse
import csv
import datetime
import io
import platform
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--lengths', type=int, nargs='+',
                        default=[256, 512, 1024, 2048, 4096])
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument('--headdim', type=int, default=16)
    parser.add_argument('--d-state', type=int, default=16)
    parser.add_argument('--out', help='also write the rows to this CSV file')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # imported after parsing, so that --help answers at once
    import torch

    from mmdinomamba.ops.ssd import ssd_chunked, ssd_quadratic
    from mmdinomamba.utils import write_text_atomic
    torch.manual_seed(0)
    rows = []
    for length in args.lengths:
        x = torch.randn(1, length, args.heads, args.headdim)
        dt = torch.rand(1, length, args.heads) * 0.1
        A = -torch.rand(args.heads)
        B, C = torch.randn(2, 1, length, 1, args.d_state)
        row = dict(date=datetime.date.today().isoformat(),
                   device=f'cpu ({platform.machine()})', seqlen=length,
                   threads=torch.get_num_threads())
        for name, fn in (('quadratic', ssd_quadratic), ('chunked', ssd_chunked)):
            start = time.perf_counter()
            fn(x, dt, A, B, C)
            row[f'{name}_s'] = round(time.perf_counter() - start, 3)
        row['command'] = 'python benchmarks/ssd_quadratic_length.py ' + ' '.join(
            argv if argv is not None else sys.argv[1:])
        rows.append(row)
        print(', '.join(f'{k} {v}' for k, v in row.items()), flush=True)
    if args.out:
        text = io.StringIO(newline='')
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(args.out, text.getvalue())


if __name__ == '__main__':
    sys.exit(main())
