"""DINO: self-distillation with no labels, as an mmpretrain self-supervised algorithm.

"Emerging Properties in Self-Supervised Vision Transformers" (Caron et al., ICCV
2021), https://arxiv.org/abs/2104.14294, Algorithm 1.

Registered in mmpretrain's MODELS only: mmdet has a detector called ``DINO``.
"""
import copy
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine import dist
from mmpretrain.models.selfsup import BaseSelfSupervisor
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

Tensor = torch.Tensor


class DINO(BaseSelfSupervisor):
    """Student (backbone + optional neck + :class:`DINOHead`) and its EMA teacher.

    Training step on V views of B images (the ``num_global_views`` global views
    first, as :class:`~mmdinomamba.datasets.transforms.DINOMultiCrop` packs them):

    1. the teacher moves towards the current student weights (EMA, below);
    2. the teacher, without gradients, embeds the global views;
    3. the student embeds every view, views of one resolution in one batch;
    4. :class:`DINOLoss` compares every (teacher global view, other student view)
       pair and updates its centre.

    EMA convention: ``teacher_momentum`` is the weight of the *old* teacher, as in
    the paper (0.996, rising to 1 with a cosine schedule set each iteration by
    :class:`~mmdinomamba.engine.hooks.DINOTeacherMomentumHook`)::

        teacher <- teacher_momentum * teacher + (1 - teacher_momentum) * student

    Step 1 runs at the start of each training forward, i.e. right after the
    previous optimizer step: it is the paper's "update the teacher after the
    student step", so iteration 0 starts from teacher == student. The EMA moves
    parameters only.

    Teacher mode: the official code builds its teacher without stochastic depth
    and runs it in train mode. Here the teacher is a copy of the student, so it is
    kept in eval mode (no drop path, no dropout) except for its BatchNorm layers
    (e.g. of ``use_bn`` heads), which train with the student: they normalise with
    the statistics of the teacher's own batch and keep their own running
    statistics, as the official teacher's do. (With running statistics instead, a
    new model whose features of different images are nearly parallel gives a
    nearly uniform teacher after centring: no signal to learn from.) Under DDP
    the batch statistics are each process's own batch (the official code syncs
    them with SyncBatchNorm, which needs a GPU); after each teacher forward the
    running statistics are averaged over the processes, so that every process
    keeps the same teacher.

    Args:
        backbone (dict): student backbone config; its output tuple's last item
            must be (batch, channels) features (``out_type='cls_token'``).
        head (dict): :class:`DINOHead` config.
        loss (dict): :class:`DINOLoss` config; its ``out_channels`` must equal
            the head's.
        neck (dict, optional): module between backbone and head. Defaults to None.
        num_global_views (int): views the teacher sees. Defaults to 2.
        teacher_momentum (float): EMA weight of the old teacher, in [0, 1].
            Defaults to 0.996.
        data_preprocessor (dict, optional): Defaults to
            ``SelfSupDataPreprocessor``.
        init_cfg (dict, optional): mmengine initialisation config.
    """

    def __init__(self,
                 backbone: dict,
                 head: dict,
                 loss: dict,
                 neck: Optional[dict] = None,
                 num_global_views: int = 2,
                 teacher_momentum: float = 0.996,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(backbone=backbone, neck=neck, head=head,
                         data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if num_global_views < 1:
            raise ValueError(f'DINO: num_global_views must be >= 1, got '
                             f'{num_global_views}')
        self.num_global_views = num_global_views
        self.teacher_momentum = teacher_momentum
        self.loss_module = MODELS.build(loss)
        self.teacher = copy.deepcopy(self._student())
        self.teacher.requires_grad_(False)
        self.train(self.training)

    # ----------------------------------------------------------------- teacher
    def _student(self) -> nn.ModuleDict:
        """The student's modules under the names the teacher mirrors."""
        modules = dict(backbone=self.backbone, head=self.head)
        if self.with_neck:
            modules['neck'] = self.neck
        return nn.ModuleDict(modules)

    @property
    def teacher_momentum(self) -> float:
        return self._teacher_momentum

    @teacher_momentum.setter
    def teacher_momentum(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f'DINO: teacher_momentum must be in [0, 1], got {value}')
        self._teacher_momentum = float(value)

    def train(self, mode: bool = True):
        """Switch the student; the teacher stays in eval mode but for its
        BatchNorm layers, which follow ``mode`` (see the class docstring)."""
        super().train(mode)
        self.teacher.eval()
        for module in self.teacher.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.train(mode)
        return self

    def init_weights(self):
        """Initialise the student, then copy it into the teacher."""
        super().init_weights()
        self.teacher.load_state_dict(self._student().state_dict())

    @torch.no_grad()
    def update_teacher(self) -> None:
        """One EMA step with :attr:`teacher_momentum` (see the class docstring)."""
        m = self.teacher_momentum
        student = dict(self._student().named_parameters())
        names, teacher = zip(*self.teacher.named_parameters())
        # multi-tensor ops: the same two operations per tensor, a few launches in all
        torch._foreach_mul_(teacher, m)
        torch._foreach_add_(teacher, [student[n].detach() for n in names], alpha=1.0 - m)

    @torch.no_grad()
    def _sync_teacher_buffers(self) -> None:
        """Average the teacher's floating buffers (BatchNorm running statistics)
        over the processes (coalesced, one collective); nothing to do in one
        process."""
        if dist.get_world_size() > 1:
            dist.all_reduce_params(
                [b for b in self.teacher.buffers() if b.is_floating_point()], op='mean')

    # ----------------------------------------------------------------- forward
    @staticmethod
    def _embed(modules: nn.ModuleDict, views: Sequence[Tensor]) -> Tensor:
        """Logits of every view: (num_views, batch, K).

        Consecutive views of one resolution go through the backbone together;
        the head then sees all views at once (as the paper's multi-crop wrapper).
        """
        feats, start = [], 0
        while start < len(views):
            stop = start + 1
            while stop < len(views) and views[stop].shape == views[start].shape:
                stop += 1
            out = modules['backbone'](torch.cat(list(views[start:stop])))
            if 'neck' in modules:
                out = modules['neck'](out)
            feats.append(out[-1] if isinstance(out, (tuple, list)) else out)
            start = stop
        logits = modules['head'](torch.cat(feats))
        return logits.view(len(views), views[0].shape[0], -1)

    def loss(self, inputs: Union[List[Tensor], Tensor],
             data_samples: List[DataSample]) -> Dict[str, Tensor]:
        """EMA step, teacher and student forward, DINO loss.

        Args:
            inputs (list[Tensor]): V views, each (batch, 3, H_v, W_v); the first
                ``num_global_views`` share one size.
            data_samples (list[DataSample]): unused (no labels).

        Returns:
            dict[str, Tensor]: ``{'loss': scalar}``.
        """
        if not isinstance(inputs, (list, tuple)) or len(inputs) < self.num_global_views:
            got = len(inputs) if isinstance(inputs, (list, tuple)) else type(inputs)
            raise ValueError(f'DINO: needs a list of at least {self.num_global_views} '
                             f'views (multi-crop pipeline), got {got}')
        global_views = inputs[:self.num_global_views]
        if len({tuple(v.shape) for v in global_views}) != 1:
            raise ValueError('DINO: global views must share one shape, got '
                             f'{[tuple(v.shape) for v in global_views]}')
        if self.training:
            self.update_teacher()
        with torch.no_grad():
            teacher_logits = self._embed(self.teacher, global_views)
            self._sync_teacher_buffers()
        student_logits = self._embed(self._student(), inputs)
        return dict(loss=self.loss_module(student_logits, teacher_logits))
