"""mmengine's CheckpointHook made safe to resume from: atomic writes, per-rank state."""
import os
import os.path as osp
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from mmengine.dist import (all_gather_object, broadcast_object_list, get_rank,
                           get_world_size, is_main_process)
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook

from ..checkpoint import write_atomic
from ..rng_state import gather_rng_states, get_rng_state, set_rng_state
from .utils import unwrap_model

RNG_KEY = 'rng_states'
BUFFERS_KEY = 'rank_buffers'
TMP_PREFIX = '.tmp-ckpt-'  # a checkpoint being written; a killed run can leave one


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

    Takes ``CheckpointHook``'s arguments and changes three things.

    1. **Order and atomicity.** mmengine 0.10 deletes the oldest checkpoint
       (``max_keep_ckpts``) first, then writes ``epoch_N.pth`` in place, so a kill
       during the write leaves a truncated file and, with ``max_keep_ckpts=1``, no
       checkpoint at all. Here the checkpoint goes to a temporary file that is
       fsynced and renamed (:func:`~mmdinomamba.engine.write_atomic`), then
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
       not) leaves the training stream unchanged.
    3. **Rank-local buffers.** mmengine saves rank 0's model only. Buffers that
       differ between ranks (mmengine's DDP does not broadcast buffers, so e.g.
       BatchNorm statistics stay per rank) are saved per rank in
       ``checkpoint['meta']['rank_buffers']`` (only those that differ from rank
       0's) and each rank loads its own.

    Persistent data workers (``persistent_workers=True`` with ``num_workers > 0``)
    keep their generators in their own processes, where no checkpoint sees them:
    a resumed run's augmentations then differ, and the hook warns (every start).
    Non-persistent workers resume exactly (with mmengine's ``worker_init_fn`` or
    :func:`~mmdinomamba.engine.rng_state.epoch_worker_init_fn`).
    Checkpoints on remote backends (``backend_args``) are written as mmengine
    writes them; the ``save_best`` checkpoint is mmengine's too.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._resumed_states: Optional[List[Dict[str, Any]]] = None
        self._val_state: Optional[Dict[str, Any]] = None

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
        if is_main_process() and isinstance(self.file_backend, LocalBackend) \
                and osp.isdir(self.out_dir):
            for name in sorted(os.listdir(self.out_dir)):
                if name.startswith(TMP_PREFIX):
                    runner.logger.warning(f'{type(self).__name__}: removing '
                                          f'{name}, a checkpoint write that was '
                                          'interrupted')
                    os.remove(osp.join(self.out_dir, name))
        if not getattr(runner, '_resume', False) or not runner._has_loaded:
            return
        states = self._resumed_states
        if states is None:
            runner.logger.warning(
                f'{type(self).__name__}: the resumed checkpoint holds no RNG states '
                '(saved by another hook?): random augmentations and drop-path masks '
                'will differ from an uninterrupted run')
        elif len(states) != get_world_size():
            runner.logger.warning(
                f'{type(self).__name__}: the checkpoint holds the RNG states of '
                f'{len(states)} processes, this run has {get_world_size()}; they are '
                'not restored and the run will differ from an uninterrupted one')
        else:
            set_rng_state(states[get_rank()])
        self._resumed_states = None

    def _warn_persistent_workers(self, runner) -> None:
        loader = runner.train_dataloader
        if getattr(loader, 'persistent_workers', False) and loader.num_workers > 0:
            runner.logger.warning(
                f'{type(self).__name__}: the train dataloader has persistent '
                f'workers ({loader.num_workers}); their random states live in the '
                'worker processes and are not checkpointed, so a resumed run '
                'draws other augmentations. Set train_dataloader.persistent_'
                'workers=False for exact resume.')

    def before_val(self, runner) -> None:
        self._val_state = get_rng_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            set_rng_state(self._val_state)
            self._val_state = None

    def _save_checkpoint_with_step(self, runner, step, meta):
        if not isinstance(self.file_backend, LocalBackend):
            super()._save_checkpoint_with_step(runner, step, meta)
            return
        # collective calls: every rank takes part
        meta = dict(meta, **{RNG_KEY: gather_rng_states(),
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
