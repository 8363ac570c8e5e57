"""Distributed training on machines without CUDA (CPU, gloo).

mmengine 0.10's ``pytorch`` launcher calls ``torch.cuda.set_device`` before it
creates the process group ("Found no NVIDIA driver"), and its default DDP wrapper
passes ``device_ids=[LOCAL_RANK]``, which torch refuses for CPU modules. The
Runner skips its own initialisation when a process group already exists and takes
the wrapper's arguments from ``model_wrapper_cfg``, so both are set up here.
torch's DDP also refuses SyncBN layers in CPU modules ("SyncBatchNorm layers only
work with GPU modules"; mmseg's heads and ``Feature2Pyramid`` use them), so the
wrapper here turns them into BN first: each process then normalises with its own
batch statistics, as mmengine does on one device. Such a layer then needs more
than one value per channel in each process (BN after a global pooling, e.g.
UperNet's pyramid pooling, sees one per image): with one image per process it
fails with an error naming the layer and the fix, not PyTorch's bare "Expected
more than 1 value per channel".
"""
import os
from typing import List

import torch
import torch.distributed as torch_dist
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm


def setup_cpu_distributed(cfg: Config) -> bool:
    """For ``cfg.launcher == 'pytorch'`` without CUDA: gloo group and CPU DDP wrapper.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (set by
    torchrun). Does nothing for other launchers, when CUDA is available or when a
    process group exists already. A configured backend other than gloo (e.g. the
    GPU configs' nccl) is replaced by gloo, the CPU backend, and the wrapper
    is :class:`CPUDistributedDataParallel` (SyncBN -> BN).

    Args:
        cfg (Config): the training config; ``model_wrapper_cfg`` gets
            ``device_ids=None`` and the type ``CPUDistributedDataParallel``
            unless it sets them.

    Returns:
        bool: whether a process group was created.
    """
    if cfg.get('launcher') != 'pytorch' or torch.cuda.is_available() \
            or torch_dist.is_initialized():
        return False
    for key in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'):
        if key not in os.environ:
            raise RuntimeError(f'--launcher pytorch needs ${key}: start the job with '
                               'torchrun (tools/dist_train.sh)')
    backend = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('backend', 'gloo')
    if backend != 'gloo':
        print_log(f'no CUDA: using the gloo backend instead of {backend!r}',
                  logger='current')
    torch_dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                                  world_size=int(os.environ['WORLD_SIZE']))
    # by import path: mmengine's Runner looks wrappers up in its root registry
    wrapper = dict(type='mmdinomamba.engine.CPUDistributedDataParallel',
                   broadcast_buffers=False,
                   find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper.update(cfg.get('model_wrapper_cfg') or {})
    wrapper.setdefault('device_ids', None)
    cfg.model_wrapper_cfg = wrapper
    return True


def teardown_distributed() -> None:
    """End a distributed job cleanly: wait for every process, then destroy the
    process group. Without it, a gloo process may exit while its communication
    threads are still joinable, which aborts it (``terminate called without an
    active exception``, exit status -6) after a run that finished. Does nothing
    without a process group."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()


def require_batch_statistics(module: nn.Module, names: List[str]) -> None:
    """Make the BN layers ``names`` of ``module`` refuse, naming themselves and the
    fix, a training batch with one value per channel.

    Args:
        module (nn.Module): the model.
        names (list[str]): dotted names of its BatchNorm layers (the SyncBN layers
            that :class:`CPUDistributedDataParallel` turned into BN).
    """
    for name in names:
        def check(layer, args, name=name):
            x = args[0]
            if layer.training and x.dim() >= 2 and x.numel() // x.shape[1] <= 1:
                raise ValueError(
                    f'{name}: BatchNorm (SyncBN on GPUs, per-process BN on the CPU) '
                    f'got one value per channel (input {tuple(x.shape)}): with '
                    'SyncBN on the CPU, every process needs at least 2 images per '
                    'batch here. Set train_dataloader.batch_size >= 2 (it is per '
                    'process), or train on GPUs')
        module.get_submodule(name).register_forward_pre_hook(check)


class CPUDistributedDataParallel(MMDistributedDataParallel):
    """mmengine's DDP wrapper for CPU modules: SyncBN layers become BN first.

    The converted layers refuse a batch of one value per channel with a clear
    error (:func:`require_batch_statistics`).

    Args:
        module (nn.Module): the model; its SyncBN layers are replaced (logged).
        **kwargs: the arguments of ``MMDistributedDataParallel``.
    """

    def __init__(self, module: nn.Module, **kwargs):
        names = [name for name, m in module.named_modules()
                 if isinstance(m, nn.SyncBatchNorm)]
        if names:
            module = revert_sync_batchnorm(module)
            require_batch_statistics(module, names)
            print_log(f'no CUDA: {len(names)} SyncBN layers -> BN (each process uses '
                      'its own batch statistics)', logger='current')
        super().__init__(module=module, **kwargs)
