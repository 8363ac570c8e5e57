"""The DINO loss: cross-entropy between a centred, sharpened teacher and the student.

"Emerging Properties in Self-Supervised Vision Transformers" (Caron et al., ICCV
2021), https://arxiv.org/abs/2104.14294, Eq. (1)-(4) and Algorithm 1.

Letters: K prototypes, T teacher (global) views, V student views (the T global
views first, then the local ones), B images per process.
"""
import torch
import torch.nn.functional as F
from mmengine import dist
from mmengine.model import BaseModule

Tensor = torch.Tensor


class DINOLoss(BaseModule):
    """DINO's multi-view distillation loss with an EMA centre.

    For teacher view t and student view v (v != t)::

        q_t = softmax((g_t - c) / teacher_temp)             (teacher, no gradient)
        log p_v = log_softmax(s_v / student_temp)
        H(t, v) = mean over images of -sum_k q_t[k] log p_v[k]
        loss = mean of H(t, v) over all pairs with v != t

    After the loss, the centre moves towards the mean teacher logit of the batch,
    averaged over all processes::

        c <- center_momentum * c + (1 - center_momentum) * mean(g)

    The centre is a persistent buffer (saved in checkpoints, so ``--resume`` keeps
    it). ``teacher_temp`` is a plain attribute, set each epoch by
    :class:`~mmdinomamba.engine.hooks.DINOTeacherTempHook`; its default is the
    paper's final value, so the loss is usable without the hook.

    Args:
        out_channels (int): K, the number of prototypes.
        student_temp (float): Defaults to 0.1.
        teacher_temp (float): Defaults to 0.04.
        center_momentum (float): Defaults to 0.9.
        init_cfg (dict, optional): unused by this module's buffers.
    """

    def __init__(self,
                 out_channels: int,
                 student_temp: float = 0.1,
                 teacher_temp: float = 0.04,
                 center_momentum: float = 0.9,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if student_temp <= 0 or teacher_temp <= 0:
            raise ValueError(f'DINOLoss: temperatures must be > 0, got student '
                             f'{student_temp}, teacher {teacher_temp}')
        if not 0.0 <= center_momentum < 1.0:
            raise ValueError(f'DINOLoss: center_momentum must be in [0, 1), got '
                             f'{center_momentum}')
        self.student_temp = student_temp
        self.teacher_temp = teacher_temp
        self.center_momentum = center_momentum
        self.register_buffer('center', torch.zeros(1, out_channels))

    def forward(self, student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
        """Compute the loss, then update the centre.

        Args:
            student_logits (Tensor): (V, B, K); views 0..T-1 are the global views
                the teacher saw, in the same order.
            teacher_logits (Tensor): (T, B, K).

        Returns:
            Tensor: scalar loss.
        """
        if student_logits.dim() != 3 or teacher_logits.dim() != 3:
            raise ValueError('DINOLoss: expected (views, batch, K) logits, got '
                             f'student {tuple(student_logits.shape)}, teacher '
                             f'{tuple(teacher_logits.shape)}')
        num_t, batch, k = teacher_logits.shape
        num_v = student_logits.shape[0]
        if student_logits.shape[1:] != (batch, k) or k != self.center.shape[1]:
            raise ValueError(f'DINOLoss: student {tuple(student_logits.shape)} and '
                             f'teacher {tuple(teacher_logits.shape)} logits do not '
                             f'match each other or K={self.center.shape[1]}')
        # pairs (t, v) with v != t; needs at least one (known from the shapes: no
        # read from the device)
        pairs = num_t * num_v - min(num_t, num_v)
        if pairs == 0:
            raise ValueError('DINOLoss: one global view and one student view give no '
                             'pair of different views')
        keep = ~torch.eye(num_t, num_v, dtype=torch.bool, device=student_logits.device)

        teacher_logits = teacher_logits.detach().float()
        q = F.softmax((teacher_logits - self.center) / self.teacher_temp, dim=-1)
        log_p = F.log_softmax(student_logits.float() / self.student_temp, dim=-1)
        cross = -torch.einsum('tbk,vbk->tv', q, log_p) / batch  # H(t, v)
        loss = torch.where(keep, cross, 0.).sum() / pairs  # the mean over the pairs
        self.update_center(teacher_logits)
        return loss

    @torch.no_grad()
    def update_center(self, teacher_logits: Tensor) -> None:
        """EMA of the mean teacher logit over views, images and processes.

        Args:
            teacher_logits (Tensor): (T, B, K).
        """
        batch_sum = teacher_logits.float().sum(dim=(0, 1)).unsqueeze(0)
        dist.all_reduce(batch_sum, op='sum')
        count = teacher_logits.shape[0] * teacher_logits.shape[1] * dist.get_world_size()
        self.center.mul_(self.center_momentum).add_(
            batch_sum / count, alpha=1.0 - self.center_momentum)
