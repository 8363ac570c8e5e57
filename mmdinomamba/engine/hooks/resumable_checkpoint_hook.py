"""mmengine's CheckpointHook made safe to resume from: atomic writes, per-rank state."""
import difflib
import inspect
import json
import os
import os.path as osp
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from mmengine.dist import (all_gather_object, broadcast_object_list, get_rank,
                           get_world_size, is_main_process)
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from mmdinomamba.utils import write_atomic, write_text_atomic
from ..finite import non_finite
from ..rng_state import gather_rng_states, get_rng_state, set_rng_state
from .utils import unwrap_model

RNG_KEY = 'rng_states'
BUFFERS_KEY = 'rank_buffers'
TMP_PREFIX = '.tmp-ckpt-'  # a checkpoint being written; a killed run can leave one
# in the work dir: the checkpoint whose validation last completed, and its iteration
VALIDATED_NAME = '.last_validation'
# what CheckpointHook takes (its **kwargs go to Runner.save_checkpoint, which gets
# all of its own arguments from the hook already: any other key is a typo)
HOOK_ARGS = tuple(name for name in inspect.signature(CheckpointHook.__init__).parameters
                  if name not in ('self', 'kwargs'))


def gather_rank_local_buffers(model: nn.Module) -> List[Dict[str, torch.Tensor]]:
    """Per rank, the saved buffers whose values differ from rank 0's (a collective call).

    Args:
        model (nn.Module): the (possibly DDP-wrapped) model.

    Returns:
        list[dict]: ``world_size`` dicts of ``state_dict`` name -> CPU tensor;
        rank 0's is empty, and so is every rank's in one process.
    """
    if get_world_size() == 1:
        return [{}]
    model = unwrap_model(model)
    state = model.state_dict()
    mine = {name: state[name].detach().cpu() for name, _ in model.named_buffers()
            if name in state}  # persistent buffers: those a checkpoint holds
    ref = [mine if get_rank() == 0 else None]
    broadcast_object_list(ref, src=0)
    return all_gather_object({name: t for name, t in mine.items()
                              if not torch.equal(t, ref[0][name])})


class ResumableCheckpointHook(CheckpointHook):
    """``CheckpointHook`` whose checkpoints a killed run resumes from exactly.

    Takes ``CheckpointHook``'s arguments (an unknown one, e.g. ``intervall``, fails
    when the hook is built, naming the closest) and changes five things.

    1. **Order and atomicity.** mmengine 0.10 deletes the oldest checkpoint
       (``max_keep_ckpts``) first, then writes ``epoch_N.pth`` in place, so a kill
       during the write leaves a truncated file and, with ``max_keep_ckpts=1``, no
       checkpoint at all. Here the checkpoint goes to a temporary file that is
       fsynced and renamed (:func:`~mmdinomamba.utils.write_atomic`), then
       ``last_checkpoint`` is replaced the same way, and only then are the old
       checkpoints deleted. A kill at any point leaves ``last_checkpoint`` naming
       a complete file. Temporary files a killed run left behind are removed
       when training starts again.
    2. **Random states.** Every rank's generator states (torch CPU, current CUDA
       device, numpy, Python; see :mod:`mmdinomamba.engine.rng_state`) are saved
       in ``checkpoint['meta']['rng_states']`` (a list indexed by rank) and
       restored when training resumes, so drop-path masks and main-process
       augmentations continue as in an uninterrupted run. Validation runs with
       the training generators saved and restored around it, so evaluating (or
       not) leaves the training stream unchanged, and the checkpoint re-saved
       when a validation finds a new best holds the training states of before
       that validation. An iteration-based run restores them again after
       mmengine's loop has skipped the iterations already trained (the skip
       loads those batches, and with ``num_workers=0`` their augmentations
       draw from the restored generators).
    3. **Rank-local buffers.** mmengine saves rank 0's model only. Buffers that
       differ between ranks (mmengine's DDP does not broadcast buffers, so e.g.
       BatchNorm statistics stay per rank) are saved per rank in
       ``checkpoint['meta']['rank_buffers']`` (only those that differ from rank
       0's) and each rank loads its own.

    4. **Only finite weights are saved.** Before any checkpoint is written (and
       before anything is deleted), one fused check covers every floating-point
       tensor of the model's ``state_dict``; a NaN or an infinity raises
       ``FloatingPointError`` naming them, and the last good checkpoint stays.
    5. **The best checkpoint too** (``save_best``): the new best file is written
       atomically, and the previous best is deleted only after it. mmengine
       deletes first, so a kill during the write leaves a 0-byte best file or none.
       A resumed run whose recorded best checkpoint is missing or empty says so
       and forgets that record, so the next validation writes a new best (a
       run killed writing the best checkpoint validates again first: 6.); a
       resumed run without a best checkpoint that does not validate again
       validates once at the end. Either way the run ends with a complete best
       checkpoint.

    6. **An interrupted validation runs again.** The checkpoint of the epoch (or
       iteration) a validation follows is written before that validation.
       When the validation completes, ``WORK_DIR/.last_validation`` records the
       checkpoint and iteration it followed. A run resumed from a checkpoint
       that the loop validates after (``val_interval``, ``val_begin``, the last
       epoch or iteration) and that this record does not name runs that
       validation first, before it trains on, so that the best checkpoint sees
       every validation of an uninterrupted run.

    Persistent data workers (``persistent_workers=True`` with ``num_workers > 0``)
    keep their generators in their own processes, where no checkpoint sees them:
    a resumed run's augmentations then differ, and the hook warns (every start).
    Non-persistent workers resume exactly (with mmengine's ``worker_init_fn`` or
    :func:`~mmdinomamba.engine.rng_state.epoch_worker_init_fn`).
    Checkpoints on remote backends (``backend_args``) are written as mmengine
    writes them.
    """

    def __init__(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - set(HOOK_ARGS))
        if unknown:
            close = {k: difflib.get_close_matches(k, HOOK_ARGS, n=1) for k in unknown}
            guesses = '; '.join(f'{k!r}: did you mean {c[0]!r}?' for k, c in close.items()
                                if c)
            raise TypeError(f'{type(self).__name__}: unknown arguments {unknown}'
                            f'{" (" + guesses + ")" if guesses else ""}; it takes '
                            f'{list(HOOK_ARGS)}')
        super().__init__(*args, **kwargs)
        self._resumed_states: Optional[List[Dict[str, Any]]] = None
        self._val_state: Optional[Dict[str, Any]] = None
        self._best_lost = False
        self._ckpt_iter: Optional[int] = None  # iterations done at the last save

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep a resumed checkpoint's RNG states; put this rank's buffers in place.

        Runs before the state dict is loaded into the model. mmengine re-seeds
        after loading when the checkpoint's seed differs from the config's, so
        the RNG states are applied later, in :meth:`before_train`.
        """
        if not getattr(runner, '_resume', False):
            return
        meta = checkpoint.get('meta', {})
        self._resumed_states = meta.get(RNG_KEY)
        buffers = meta.get(BUFFERS_KEY)
        if buffers is not None and len(buffers) == get_world_size():
            checkpoint['state_dict'].update(buffers[get_rank()])  # before it loads

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._warn_persistent_workers(runner)
        local = isinstance(self.file_backend, LocalBackend)
        if is_main_process() and local and osp.isdir(self.out_dir):
            for name in sorted(os.listdir(self.out_dir)):
                if name.startswith(TMP_PREFIX):
                    runner.logger.warning(f'{type(self).__name__}: removing '
                                          f'{name}, a checkpoint write that was '
                                          'interrupted')
                    os.remove(osp.join(self.out_dir, name))
        if getattr(runner, '_resume', False) and runner._has_loaded:
            # the resumed run's checkpoint, re-saved when a new best is recorded
            self.last_ckpt = runner.message_hub.get_info('last_ckpt')
        if local and self.save_best:
            self._forget_lost_best(runner)
        if not getattr(runner, '_resume', False) or not runner._has_loaded:
            return
        self._ckpt_iter = runner.iter
        state = self._resumed_state(runner)
        self._resumed_states = None
        if state is not None:
            set_rng_state(state)
            loop = runner.train_loop
            if isinstance(loop, IterBasedTrainLoop) and loop.iter > 0:
                # mmengine's loop skips the trained iterations by loading their
                # batches (augmenting them, with num_workers=0, in this
                # process): restore the states again after that
                loop.dataloader_iterator = _RestoreAfterSkip(loop, loop.iter, state)
        self._redo_interrupted_validation(runner)

    def _resumed_state(self, runner) -> Optional[Dict[str, Any]]:
        """This rank's RNG state from the resumed checkpoint, or None (logged)."""
        states = self._resumed_states
        if states is None:
            runner.logger.warning(
                f'{type(self).__name__}: the resumed checkpoint holds no RNG states '
                '(saved by another hook?): random augmentations and drop-path masks '
                'will differ from an uninterrupted run')
            return None
        if len(states) != get_world_size():
            runner.logger.warning(
                f'{type(self).__name__}: the checkpoint holds the RNG states of '
                f'{len(states)} processes, this run has {get_world_size()}; they are '
                'not restored and the run will differ from an uninterrupted one')
            return None
        return states[get_rank()]

    def _validates_here(self, runner) -> bool:
        """Whether the train loop validates at its current position (as it
        decides right after an epoch or an iteration)."""
        loop, val_loop = runner.train_loop, runner.val_loop
        if val_loop is None:
            return False
        if isinstance(loop, EpochBasedTrainLoop) and self.by_epoch:
            position, last = loop.epoch, loop.max_epochs
        elif isinstance(loop, IterBasedTrainLoop) and not self.by_epoch:
            position, last = loop.iter, loop.max_iters
        else:  # a checkpoint mid-epoch, or another loop: no validation follows it
            return False
        loop._decide_current_val_interval()  # the interval at this position
        return (position > 0 and position >= loop.val_begin
                and (position % loop.val_interval == 0 or position == last))

    def _redo_interrupted_validation(self, runner) -> None:
        """On resume: run the validation that followed the resumed checkpoint in
        the interrupted run, unless ``.last_validation`` says it completed."""
        done = None
        if is_main_process():
            done = self._read_validated(runner)
        done = [done]
        broadcast_object_list(done, src=0)  # every rank takes the same branch
        if done[0] is None or done[0] or not self._validates_here(runner):
            return
        where = (f'epoch {runner.epoch}' if isinstance(runner.train_loop,
                                                       EpochBasedTrainLoop)
                 else f'iteration {runner.iter}')
        runner.logger.warning(
            f'{type(self).__name__}: the validation after {where} (checkpoint '
            f'{self.last_ckpt}) did not complete in the interrupted run: running it '
            'again before training goes on')
        runner.val_loop.run()

    def _read_validated(self, runner) -> Optional[bool]:
        """Whether ``.last_validation`` records a completed validation after the
        resumed checkpoint; None when there is no checkpoint path to compare."""
        if self.last_ckpt is None:
            return None
        path = osp.join(runner.work_dir, VALIDATED_NAME)
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return False
        return (isinstance(record, dict) and record.get('checkpoint') == self.last_ckpt
                and record.get('iter') == runner.iter)

    def after_val_epoch(self, runner, metrics) -> None:
        super().after_val_epoch(runner, metrics)  # the best checkpoint first
        if (is_main_process() and self.last_ckpt is not None
                and self._ckpt_iter == runner.iter):
            # this validation followed the last checkpoint: it is done
            write_text_atomic(osp.join(runner.work_dir, VALIDATED_NAME),
                              json.dumps(dict(checkpoint=self.last_ckpt,
                                              iter=runner.iter)))

    def _warn_persistent_workers(self, runner) -> None:
        loader = runner.train_dataloader
        if getattr(loader, 'persistent_workers', False) and loader.num_workers > 0:
            runner.logger.warning(
                f'{type(self).__name__}: the train dataloader has persistent '
                f'workers ({loader.num_workers}); their random states live in the '
                'worker processes and are not checkpointed, so a resumed run '
                'draws other augmentations. Set train_dataloader.persistent_'
                'workers=False for exact resume.')

    def _best_keys(self, key: str):
        """The message hub's keys of the best score and checkpoint of ``key``."""
        if len(self.key_indicators) == 1:
            return 'best_score', 'best_ckpt'
        return f'best_score_{key}', f'best_ckpt_{key}'

    def _forget_lost_best(self, runner) -> None:
        """On resume: note a best checkpoint that is missing, and drop the record
        of one whose file is missing or empty."""
        if not getattr(runner, '_resume', False) or not runner._has_loaded:
            return
        info = runner.message_hub.runtime_info
        for key in self.key_indicators:
            score_key, ckpt_key = self._best_keys(key)
            path = info.get(ckpt_key)
            if path is not None and osp.isfile(path) and osp.getsize(path) > 0:
                continue
            self._best_lost = True  # no best checkpoint yet, or a lost one
            if path is None:
                continue
            runner.logger.warning(
                f'{type(self).__name__}: the best checkpoint {path} of the resumed '
                'run is missing or empty (its write was interrupted): the next '
                'validation writes a new best checkpoint')
            if is_main_process() and osp.isfile(path):
                os.remove(path)
            info.pop(score_key, None)
            info.pop(ckpt_key, None)
            if len(self.key_indicators) == 1:
                self.best_ckpt_path = None
            else:
                self.best_ckpt_path_dict[key] = None

    def after_train(self, runner) -> None:
        if self._best_lost and runner.val_loop is not None:
            runner.logger.warning(f'{type(self).__name__}: the resumed run has no '
                                  'best checkpoint and did not validate: validating '
                                  'once to write it')
            runner.val_loop.run()
        super().after_train(runner)

    def before_val(self, runner) -> None:
        self._val_state = get_rng_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            set_rng_state(self._val_state)
            self._val_state = None

    def _check_finite(self, runner, path: str) -> None:
        """Raise before ``path`` is written if the model holds non-finite tensors
        (a collective call: every rank checks, all agree)."""
        bad = non_finite(unwrap_model(runner.model).state_dict().items(),
                         distributed=True)
        if bad:
            last = runner.message_hub.get_info('last_ckpt')
            raise FloatingPointError(
                f'{type(self).__name__}: not writing {path}: the model holds NaN or '
                f'infinite values in {len(bad)} tensors ({", ".join(bad[:8])}). '
                + (f'The last good checkpoint, {last}, is kept.' if last else
                   'No checkpoint was written.'))

    def _save_checkpoint_with_step(self, runner, step, meta):
        self._check_finite(runner, osp.join(self.out_dir, self.filename_tmpl.format(step)))
        self._ckpt_iter = meta.get('iter')  # what a validation now would follow
        if not isinstance(self.file_backend, LocalBackend):
            super()._save_checkpoint_with_step(runner, step, meta)
            return
        # collective calls: every rank takes part. Saved during a validation (a
        # new best), the training states of before it: what the run continues with
        meta = dict(meta, **{RNG_KEY: gather_rng_states(self._val_state),
                             BUFFERS_KEY: gather_rank_local_buffers(runner.model)})
        stale = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids
                                            and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                stale.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = osp.join(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        if not is_main_process():
            return

        def save(tmp: str) -> None:
            runner.save_checkpoint(
                osp.dirname(tmp), osp.basename(tmp), self.file_client_args,
                save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler, meta=meta,
                by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)

        def point(tmp: str) -> None:
            with open(tmp, 'w') as f:
                f.write(self.last_ckpt)

        write_atomic(self.last_ckpt, save, prefix=TMP_PREFIX)
        write_atomic(osp.join(runner.work_dir, 'last_checkpoint'), point)
        for old in stale:
            path = osp.join(self.out_dir, self.filename_tmpl.format(old))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)

    def _save_best_checkpoint(self, runner, metrics) -> None:
        if not self.save_best or not isinstance(self.file_backend, LocalBackend):
            super()._save_best_checkpoint(runner, metrics)
            return
        step = runner.epoch if self.by_epoch else runner.iter
        meta = dict(epoch=runner.epoch, iter=runner.iter)
        if 'auto' in self.key_indicators:
            self._init_rule(self.rules, [list(metrics.keys())[0]])
        updated = False
        for key, rule in zip(self.key_indicators, self.rules):
            score_key, ckpt_key = self._best_keys(key)
            score = metrics[key]
            best = runner.message_hub.runtime_info.get(score_key,
                                                       self.init_value_map[rule])
            if score is None or not self.is_better_than[key](score, best):
                continue
            updated = True
            single = len(self.key_indicators) == 1
            old = self.best_ckpt_path if single else self.best_ckpt_path_dict[key]
            name = f'best_{key}_{self.filename_tmpl.format(step)}'.replace('/', '_')
            path = osp.join(self.out_dir, name)
            self._check_finite(runner, path)
            runner.message_hub.update_info(score_key, score)
            runner.message_hub.update_info(ckpt_key, path)
            if single:
                self.best_ckpt_path = path
            else:
                self.best_ckpt_path_dict[key] = path
            if is_main_process():
                write_atomic(path, lambda tmp: runner.save_checkpoint(
                    osp.dirname(tmp), osp.basename(tmp), self.file_client_args,
                    save_optimizer=False, save_param_scheduler=False, meta=meta,
                    by_epoch=False, backend_args=self.backend_args), prefix=TMP_PREFIX)
                if old and old != path and osp.isfile(old):
                    os.remove(old)  # only now that the new best is complete
                    runner.logger.info(f'The previous best checkpoint {old} is removed')
            runner.logger.info(f'The best checkpoint with {score:0.4f} {key} at '
                               f'{step} {"epoch" if self.by_epoch else "iter"} is saved '
                               f'to {name}.')
            self._best_lost = False
        # the regular checkpoint again, so that it records the new best (as mmengine)
        if updated and self.last_ckpt is not None:
            self._save_checkpoint_with_step(runner, step, meta)


class _RestoreAfterSkip:
    """An iteration-based loop's data iterator that, once the loop has skipped
    ``skip`` batches (those trained before the resume), restores ``state`` before
    the next batch is loaded, and then hands the loop its iterator back."""

    def __init__(self, loop: IterBasedTrainLoop, skip: int, state: Dict[str, Any]):
        self.loop, self.iterator = loop, loop.dataloader_iterator
        self.skip, self.state = skip, state

    def __iter__(self):
        return self

    def __next__(self):
        if self.skip > 0:
            self.skip -= 1
            return next(self.iterator)
        set_rng_state(self.state)
        self.loop.dataloader_iterator = self.iterator
        return next(self.iterator)
