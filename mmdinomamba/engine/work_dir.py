"""What a run leaves in its work dir, read back: checkpoints and logged scalars.

- :func:`set_work_dir`: where a run writes (the command line's folder, the
  config's, or ``./work_dirs/<config name>``); :func:`run_folders`: every local
  folder it writes (the work dir, and the checkpoint and log ``out_dir``);
- :func:`find_resume_checkpoint` / :func:`check_resume_checkpoint`: the checkpoint
  ``--resume`` continues from, with clear errors where mmengine's would be
  cryptic;
- :func:`epoch_checkpoints` / :func:`latest_checkpoint`: the ``epoch_N.pth``
  files, by N;
- :func:`logged_runs` / :func:`read_scalars` / :func:`epoch_losses`: the runs
  that have logged, the records of a run's ``vis_data/scalars.json``, and the
  mean loss of each epoch.
"""
import glob
import json
import os.path as osp
from collections import defaultdict
from typing import Dict, List, Optional

__all__ = ['check_resume_checkpoint', 'epoch_checkpoints', 'epoch_losses',
           'find_resume_checkpoint', 'latest_checkpoint', 'logged_runs',
           'read_scalars', 'run_folders', 'set_work_dir']


def set_work_dir(cfg, work_dir: Optional[str], config_path: str) -> str:
    """Set ``cfg.work_dir``: ``work_dir`` if given, else the config's own, else
    ``./work_dirs/<config file name>``, as the OpenMMLab tools do; returns it."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])
    return cfg.work_dir


def run_folders(cfg) -> List[str]:
    """Every local folder a run of ``cfg`` writes: the work dir, then the folders
    of ``default_hooks.checkpoint.out_dir`` and ``default_hooks.logger.out_dir``.

    mmengine's ``CheckpointHook`` and ``LoggerHook`` write into
    ``OUT_DIR/<last folder of the work dir>`` when an ``out_dir`` is set, so two
    runs with work dirs of one name and one ``out_dir`` write the same files.
    Remote ``out_dir`` (``s3://...``) are left out.

    Args:
        cfg (Config): a training config, ``cfg.work_dir`` set
            (:func:`set_work_dir`).

    Returns:
        list[str]: absolute paths, the work dir first, each once.
    """
    work_dir = osp.abspath(cfg.work_dir)
    folders = [work_dir]
    hooks = cfg.get('default_hooks') or {}
    for name in ('checkpoint', 'logger'):
        out_dir = (hooks.get(name) or {}).get('out_dir')
        if not out_dir or '://' in str(out_dir):
            continue
        # as the hooks do: a folder named after the work dir, unless out_dir is it
        folder = work_dir if osp.abspath(out_dir) == work_dir else osp.join(
            osp.abspath(out_dir), osp.basename(work_dir.rstrip(osp.sep)))
        if folder not in folders:
            folders.append(folder)
    return folders


def find_resume_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint that ``--resume`` (without a path) continues from.

    Reads ``WORK_DIR/last_checkpoint``, as mmengine's auto-resume does, but fails
    clearly where mmengine would log "Auto resumed from the latest checkpoint ."
    and then fail with "FileNotFoundError:  can not be found.".

    Args:
        work_dir (str): the run's work directory.

    Returns:
        str or None: the checkpoint path, or None when the run has saved none
        (no ``last_checkpoint``: training starts from scratch).

    Raises:
        FileNotFoundError: ``last_checkpoint`` is empty, or names a file that
            does not exist; the message names both files.
    """
    pointer = osp.join(work_dir, 'last_checkpoint')
    if not osp.exists(pointer):
        return None
    with open(pointer) as f:
        path = f.read().strip()
    if not path:
        raise FileNotFoundError(
            f'{pointer} is empty: it should name the checkpoint to resume from. '
            'Pass one with --resume PATH, or delete the file to start from scratch')
    check_resume_checkpoint(path, f' (named by {pointer})')
    return path


def check_resume_checkpoint(path: str, origin: str = '') -> None:
    """Fail with a clear message if the checkpoint at ``path`` is absent or empty.

    Only local paths are checked; URLs and other backends are left to mmengine.

    Args:
        path (str): the checkpoint to resume from.
        origin (str): where the path came from, appended to the message.
            Defaults to ''.

    Raises:
        FileNotFoundError: the file does not exist, or is empty.
    """
    if '://' in path:
        return
    if not osp.isfile(path):
        raise FileNotFoundError(f'cannot resume: checkpoint {path}{origin} does not '
                                'exist')
    if osp.getsize(path) == 0:
        raise FileNotFoundError(f'cannot resume: checkpoint {path}{origin} is empty '
                                '(0 bytes; an interrupted write?)')


def epoch_checkpoints(work_dir: str) -> List[str]:
    """The ``epoch_N.pth`` files of an mmengine work dir, sorted by N."""
    return sorted(glob.glob(osp.join(work_dir, 'epoch_*.pth')),
                  key=lambda p: int(osp.basename(p)[len('epoch_'):-len('.pth')]))


def latest_checkpoint(work_dir: str) -> str:
    """The ``epoch_N.pth`` of an mmengine work dir with the highest N.

    Raises:
        FileNotFoundError: the work dir holds no ``epoch_*.pth``.
    """
    ckpts = epoch_checkpoints(work_dir)
    if not ckpts:
        raise FileNotFoundError(f'no epoch_*.pth checkpoint in {work_dir}: did the '
                                'run save one (default_hooks.checkpoint.interval)?')
    return ckpts[-1]


def logged_runs(work_dir: str) -> List[str]:
    """The runs of an mmengine work dir that have logged scalars: the names of
    their ``<timestamp>`` folders (with ``vis_data/scalars.json``), oldest first."""
    return sorted(osp.basename(osp.dirname(osp.dirname(p))) for p in
                  glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))


def read_scalars(work_dir: str, run: Optional[str] = None) -> List[dict]:
    """The records of a run's ``vis_data/scalars.json`` (one dict a logged step).

    Args:
        work_dir (str): an mmengine work dir.
        run (str, optional): the run's ``<timestamp>`` folder
            (:func:`logged_runs`); None: the latest run.

    Returns:
        list[dict]: the records, without a last line still being written.

    Raises:
        FileNotFoundError: no such run, or no run that has logged.
    """
    if run is None:
        runs = logged_runs(work_dir)
        if not runs:
            raise FileNotFoundError(f'no <timestamp>/vis_data/scalars.json under '
                                    f'{work_dir}: no run has logged there')
        run = runs[-1]
    path = osp.join(work_dir, run, 'vis_data', 'scalars.json')
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} does not exist: run {run!r} has not logged')
    with open(path) as f:
        lines = f.read().split('\n')
    # a training process appends whole lines; the text after the last newline is
    # a line it is still writing
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def epoch_losses(records: List[dict], key: str = 'loss') -> Dict[int, float]:
    """The mean of ``key`` over each epoch's logged steps: epoch -> mean.

    Args:
        records (list[dict]): :func:`read_scalars` records; those without
            ``key`` or ``epoch`` (e.g. validation metrics) are skipped.
        key (str): the scalar averaged. Defaults to 'loss'.
    """
    per_epoch = defaultdict(list)
    for rec in records:
        if key in rec and 'epoch' in rec:
            per_epoch[rec['epoch']].append(rec[key])
    return {e: sum(v) / len(v) for e, v in sorted(per_epoch.items())}
