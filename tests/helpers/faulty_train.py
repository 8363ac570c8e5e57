"""Run ``tools/train.py`` as a real training process that dies at a chosen point.

Usage (from the repository root): python -m tests.helpers.faulty_train FAULT N --
TRAIN_ARGS...

FAULT is one of
  kill-after-iter  SIGKILL itself after training iteration N (counted from 1 in
                   this process), e.g. between two checkpoint saves;
  kill-in-write    during the N-th checkpoint file write of this process, write
                   half of the bytes, fsync, then SIGKILL itself;
  raise-in-write   during the N-th checkpoint file write, write half of the bytes,
                   then raise OSError (a full disk): the run ends with a traceback;
  kill-in-val      SIGKILL itself in the N-th validation of this process, after
                   its first batch (the checkpoint it follows is written, its
                   metrics and best checkpoint are not);
  nan-at-iter      before training iteration N, put a NaN into the first parameter
                   of the model's backbone (the ops' own finiteness checks as
                   they are: on, on the CPU);
  nan-at-iter-unchecked  the same with the ops' own checks off, as they are on
                   CUDA (what reaches the checkpoint hook without
                   NonFiniteStopHook).
"""
import os
import os.path as osp
import runpy
import signal
import sys

from mmengine.fileio import LocalBackend
from mmengine.runner import Runner

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
FAULTS = ('kill-after-iter', 'kill-in-write', 'raise-in-write', 'kill-in-val',
          'nan-at-iter', 'nan-at-iter-unchecked')


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def install(fault: str, n: int) -> None:
    if fault.startswith('nan-at-iter'):
        import torch

        from mmdinomamba.engine.hooks.utils import unwrap_model
        from mmdinomamba.ops import set_finite_checks

        if fault == 'nan-at-iter-unchecked':
            set_finite_checks(False)
        call_hook, started = Runner.call_hook, []

        def poisoning_call_hook(self, fn_name, **kwargs):
            if fn_name == 'before_train_iter':
                started.append(1)
                if len(started) == n:
                    with torch.no_grad():
                        next(unwrap_model(self.model).backbone.parameters()).view(-1)[0] \
                            = float('nan')
            call_hook(self, fn_name, **kwargs)

        Runner.call_hook = poisoning_call_hook
        return
    if fault == 'kill-in-val':
        call_hook, validations = Runner.call_hook, []

        def killing_call_hook(self, fn_name, **kwargs):
            call_hook(self, fn_name, **kwargs)
            if fn_name == 'before_val':
                validations.append(1)
            elif fn_name == 'after_val_iter' and len(validations) == n:
                die()

        Runner.call_hook = killing_call_hook
        return
    if fault == 'kill-after-iter':
        call_hook, done = Runner.call_hook, []

        def counting_call_hook(self, fn_name, **kwargs):
            call_hook(self, fn_name, **kwargs)
            if fn_name == 'after_train_iter':
                done.append(1)
                if len(done) == n:
                    die()

        Runner.call_hook = counting_call_hook
        return
    put, writes = LocalBackend.put, []

    def faulty_put(self, obj, filepath):
        if not str(filepath).endswith('.pth'):
            return put(self, obj, filepath)
        writes.append(filepath)
        if len(writes) < n:
            return put(self, obj, filepath)
        with open(filepath, 'wb') as f:
            f.write(obj[:len(obj) // 2])
            f.flush()
            os.fsync(f.fileno())
        if fault == 'kill-in-write':
            die()
        raise OSError(f'injected: no space left on the device writing {filepath}')

    LocalBackend.put = faulty_put


def main():
    fault, n, sep, *train_args = sys.argv[1:]
    if fault not in FAULTS or sep != '--':
        raise SystemExit(f'usage: FAULT N -- TRAIN_ARGS; FAULT one of {FAULTS}')
    install(fault, int(n))
    sys.argv = [osp.join(ROOT, 'tools/train.py')] + train_args
    runpy.run_path(sys.argv[0], run_name='__main__')


if __name__ == '__main__':
    main()
