"""DINOLoss against a straightforward loop over the paper's formula."""
import math

import pytest
import torch

from mmdinomamba.models.losses import DINOLoss


def paper_loss(student, teacher, center, student_temp, teacher_temp, center_momentum):
    """Caron et al. 2021, Algorithm 1, written per image, per view pair, per class.

    student: (V, B, K), teacher: (T, B, K), center: (K,), all nested lists of floats.
    Returns (loss, new centre).
    """
    num_v, batch, k = len(student), len(student[0]), len(student[0][0])
    num_t = len(teacher)
    total, pairs = 0.0, 0
    for t in range(num_t):
        for v in range(num_v):
            if v == t:
                continue  # the same view seen by teacher and student
            pair = 0.0
            for b in range(batch):
                z_t = [(teacher[t][b][j] - center[j]) / teacher_temp for j in range(k)]
                z_s = [student[v][b][j] / student_temp for j in range(k)]
                max_t, max_s = max(z_t), max(z_s)
                norm_t = sum(math.exp(z - max_t) for z in z_t)
                log_norm_s = max_s + math.log(sum(math.exp(z - max_s) for z in z_s))
                pair += sum(-math.exp(z_t[j] - max_t) / norm_t * (z_s[j] - log_norm_s)
                            for j in range(k))
            total += pair / batch
            pairs += 1
    mean_teacher = [sum(teacher[t][b][j] for t in range(num_t) for b in range(batch))
                    / (num_t * batch) for j in range(k)]
    new_center = [center_momentum * center[j] + (1 - center_momentum) * mean_teacher[j]
                  for j in range(k)]
    return total / pairs, new_center


@pytest.mark.parametrize('num_views,num_global', [(6, 2), (2, 2), (3, 1)])
def test_loss_and_centre_match_the_paper(num_views, num_global):
    torch.manual_seed(0)
    batch, k = 3, 7
    loss_fn = DINOLoss(k, student_temp=0.1, teacher_temp=0.05, center_momentum=0.9)
    loss_fn.center.copy_(torch.randn(1, k))  # a non-trivial centre from "earlier"
    student = torch.randn(num_views, batch, k, dtype=torch.float64)
    teacher = torch.randn(num_global, batch, k, dtype=torch.float64)
    center = loss_fn.center[0].double().tolist()
    want_loss, want_center = paper_loss(student.tolist(), teacher.tolist(), center,
                                        0.1, 0.05, 0.9)
    got = loss_fn(student, teacher)
    # float32 softmax on logits of size ~40: relative error ~1e-6
    assert got.item() == pytest.approx(want_loss, rel=1e-5)
    assert torch.allclose(loss_fn.center[0].double(), torch.tensor(want_center,
                          dtype=torch.float64), atol=1e-6)


def test_centre_used_before_update_and_teacher_gets_no_gradient():
    torch.manual_seed(1)
    loss_fn = DINOLoss(5)
    student = torch.randn(4, 2, 5, requires_grad=True)
    teacher = torch.randn(2, 2, 5, requires_grad=True)
    first = loss_fn(student, teacher)
    first.backward()
    assert teacher.grad is None and student.grad is not None
    # the same inputs again: the centre moved, so the loss changes
    assert loss_fn(student, teacher).item() != pytest.approx(first.item(), rel=1e-6)


def test_identical_pairs_are_excluded():
    # student view v equal to teacher view t (same logits): with one global view and
    # the student's first view identical to it, only cross pairs count
    k = 4
    loss_fn = DINOLoss(k, student_temp=1.0, teacher_temp=1.0)
    teacher = torch.tensor([[[10.0, 0.0, 0.0, 0.0]]])
    # view 0 (excluded) predicts class 3, view 1 predicts class 0 like the teacher
    student = torch.tensor([[[0.0, 0.0, 0.0, 50.0]], [[50.0, 0.0, 0.0, 0.0]]])
    loss = loss_fn(student, teacher)
    # H(q, p_1) <= entropy-ish small value; including view 0 would add ~50
    assert loss.item() < 1.0


def test_bad_inputs_raise():
    loss_fn = DINOLoss(5)
    with pytest.raises(ValueError, match='views, batch, K'):
        loss_fn(torch.randn(2, 5), torch.randn(2, 2, 5))
    with pytest.raises(ValueError, match='do not'):
        loss_fn(torch.randn(3, 2, 6), torch.randn(2, 2, 6))
    with pytest.raises(ValueError, match='no pair'):
        loss_fn(torch.randn(1, 2, 5), torch.randn(1, 2, 5))
    with pytest.raises(ValueError, match='temperatures'):
        DINOLoss(5, teacher_temp=0.0)
    with pytest.raises(ValueError, match='center_momentum'):
        DINOLoss(5, center_momentum=1.0)
