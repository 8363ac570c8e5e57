"""k-NN accuracy of a backbone's features, logged during training (DINO's monitor)."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.dist import collect_results, get_world_size, is_main_process
from mmengine.hooks import Hook

from mmdinomamba.evaluation import bootstrap_ci, knn_accuracy
from .utils import find_attr, unwrap_model

Tensor = torch.Tensor


class KNNMonitorHook(Hook):
    """Log the k-NN top-1 accuracy of a backbone's frozen features while training.

    DINO's protocol (:func:`mmdinomamba.evaluation.knn_accuracy`: cosine, weighted
    vote of the ``k`` nearest bank images with temperature ``temperature``): the
    images of ``bank_dataloader`` (with labels) are the bank, and those of
    ``query_dataloader`` are classified. It runs before the first step when
    ``before_train`` is set, which measures the random initialisation (a resumed
run: the checkpoint it resumes from), and after
    every ``interval`` epochs. The batches go through the model's data
    preprocessor, then ``module`` (by default the DINO teacher's backbone), in eval
    mode without gradients. The last output is the feature, (batch, dim).

    Each measurement is logged as a line with its 95 % bootstrap interval over the
    query images. It goes to the visualizer's scalars as ``knn/top1`` (a fraction)
    at the current iteration, so it lands in ``scalars.json`` and any other
    backend. In distributed runs each rank measures its shard of each loader
    (mmengine's ``DefaultSampler``), and rank 0 gathers the features.

    Args:
        bank_dataloader (dict): dataloader config of the bank, e.g. the training
            images with a resize-only pipeline (``Runner.build_dataloader``).
        query_dataloader (dict): dataloader config of the held-out images.
        module (str): dotted path of the feature extractor in the model.
            Defaults to ``'teacher.backbone'``.
        interval (int): epochs between measurements. Defaults to 1.
        k (int): neighbours. Defaults to 20.
        temperature (float): vote temperature. Defaults to 0.07.
        before_train (bool): also measure before the first step. Defaults to True.
    """
    priority = 'LOW'

    def __init__(self, bank_dataloader: dict, query_dataloader: dict,
                 module: str = 'teacher.backbone', interval: int = 1, k: int = 20,
                 temperature: float = 0.07, before_train: bool = True):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f'KNNMonitorHook: interval must be a positive int, got '
                             f'{interval!r}')
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f'KNNMonitorHook: k must be a positive int, got {k!r}')
        if not temperature > 0:
            raise ValueError(f'KNNMonitorHook: temperature must be > 0, got '
                             f'{temperature!r}')
        self.bank_cfg = bank_dataloader
        self.query_cfg = query_dataloader
        self.module = module
        self.interval = interval
        self.k = k
        self.temperature = temperature
        self.measure_before_train = before_train
        self._loaders = None
        self.history = []  # (iteration, top-1), in the order measured

    def before_train(self, runner) -> None:
        from mmengine.runner import Runner
        self._loaders = tuple(Runner.build_dataloader(cfg, seed=runner.seed)
                              for cfg in (self.bank_cfg, self.query_cfg))
        find_attr(unwrap_model(runner.model), self.module, 'KNNMonitorHook')
        if self.measure_before_train:
            self.measure(runner)

    def after_train_epoch(self, runner) -> None:
        if self.every_n_epochs(runner, self.interval) or self.is_last_train_epoch(runner):
            self.measure(runner)

    @torch.no_grad()
    def extract(self, model: nn.Module, loader) -> Optional[Tuple[Tensor, Tensor]]:
        """Features (num_images, dim) and labels (num_images,) of a loader's
        images, in the loader's order; on rank 0 only (None elsewhere)."""
        module = find_attr(model, self.module, 'KNNMonitorHook')
        was_training = module.training
        module.eval()
        rows = []
        try:
            for data in loader:
                data = model.data_preprocessor(data, False)
                out = module(data['inputs'])
                feats = out[-1] if isinstance(out, (tuple, list)) else out
                if feats.dim() != 2:
                    raise ValueError(
                        f'KNNMonitorHook: `{self.module}` must give (batch, dim) '
                        f'features, got {tuple(feats.shape)}; use a readout output '
                        "type (e.g. out_type='cls_token')")
                labels = [int(s.gt_label) for s in data['data_samples']]
                rows += [(f, y) for f, y in zip(feats.float().cpu(), labels)]
        finally:
            module.train(was_training)
        rows = collect_results(rows, len(loader.dataset)) if get_world_size() > 1 \
            else rows
        if not is_main_process():
            return None
        return (torch.stack([f for f, _ in rows]),
                torch.tensor([y for _, y in rows], dtype=torch.long))

    def measure(self, runner) -> Optional[float]:
        """Measure and log now; the top-1 on rank 0 (None elsewhere)."""
        model = unwrap_model(runner.model)
        bank, query = (self.extract(model, loader) for loader in self._loaders)
        if bank is None:
            return None
        hits = knn_accuracy(bank[0], bank[1], query[0], query[1], self.k,
                            self.temperature)
        ci = bootstrap_ci(hits.numpy())
        runner.logger.info(
            f'k-NN (k={self.k}, T={self.temperature}) of {self.module} at iteration '
            f'{runner.iter}: top-1 {100 * ci.mean:.2f} % [{100 * ci.low:.2f}, '
            f'{100 * ci.high:.2f}] ({len(hits)} images, bank {len(bank[1])})')
        runner.visualizer.add_scalars({'knn/top1': ci.mean}, step=runner.iter)
        self.history.append((runner.iter, ci.mean))
        return ci.mean
