"""The DINO algorithm: EMA teacher, multi-crop routing, registration."""
import copy

import pytest
import torch

from mmdet import registry as mmdet_registry
from mmengine.optim import OptimWrapper
from mmpretrain import registry as mmpretrain_registry
from mmpretrain.structures import DataSample

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.models.heads import DINOHead

K = 48


def tiny_dino(**kwargs):
    cfg = dict(
        type='DINO',
        backbone=dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2),
                      img_size=32, patch_size=8, drop_path_rate=0.0,
                      mixer_cfg=dict(d_state=16, headdim=16)),
        head=dict(type='DINOHead', in_channels=32, out_channels=K, hidden_channels=64,
                  bottleneck_channels=16),
        loss=dict(type='DINOLoss', out_channels=K),
        teacher_momentum=0.9)
    cfg.update(kwargs)
    return mmpretrain_registry.MODELS.build(cfg)


def batch(num_local=3, size=32, local=16, n=2):
    views = [torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8)
             for _ in range(2)]
    views += [torch.randint(0, 256, (n, 3, local, local), dtype=torch.uint8)
              for _ in range(num_local)]
    return dict(inputs=views, data_samples=[DataSample() for _ in range(n)])


def params(module):
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_registered_in_mmpretrain_only():
    assert mmpretrain_registry.MODELS.get('DINO').__module__ == \
        'mmdinomamba.models.selfsup.dino'
    assert mmdet_registry.MODELS.get('DINO').__module__.startswith('mmdet')


def test_teacher_has_no_gradients_and_stays_in_eval():
    torch.manual_seed(0)
    model = tiny_dino()
    model.train()
    assert not model.teacher.training and model.backbone.training
    assert all(not p.requires_grad for p in model.teacher.parameters())
    data = model.data_preprocessor(batch(), True)
    loss = model.loss(**data)['loss']
    loss.backward()
    assert all(p.grad is None for p in model.teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0
               for p in model.backbone.parameters())


def bn_dino(**kwargs):
    return tiny_dino(
        head=dict(type='DINOHead', in_channels=32, out_channels=K, hidden_channels=64,
                  bottleneck_channels=16, use_bn=True), **kwargs)


def test_teacher_batchnorm_uses_batch_statistics_in_training():
    """As the official teacher (which runs in train mode), the teacher's BatchNorm
    layers normalise with the batch's own statistics while training, and with
    their running statistics in eval mode; the rest of the teacher (drop path)
    stays in eval mode."""
    torch.manual_seed(0)
    model = bn_dino(backbone=dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2),
                                  img_size=32, patch_size=8, drop_path_rate=0.5,
                                  mixer_cfg=dict(d_state=16, headdim=16)))
    model.init_weights()
    bns = [m for m in model.teacher.modules()
           if isinstance(m, torch.nn.BatchNorm1d)]
    assert bns and all(m.training for m in bns)
    assert not model.teacher['backbone'].training
    views = model.data_preprocessor(batch(n=4), True)['inputs'][:2]
    with torch.no_grad():
        got = model._embed(model.teacher, views)
        again = model._embed(model.teacher, views)
        # an independent evaluation: the features, then the head's layers by hand,
        # BatchNorm from the batch's mean and biased variance
        feats = model.teacher['backbone'](torch.cat(views))[-1]
        x = feats
        for layer in model.teacher['head'].mlp:
            if isinstance(layer, torch.nn.BatchNorm1d):
                mean, var = x.mean(0), x.var(0, unbiased=False)
                x = (x - mean) / torch.sqrt(var + layer.eps) * layer.weight + layer.bias
            else:
                x = layer(x)
        want = model.teacher['head'].last_layer(torch.nn.functional.normalize(x, dim=-1))
    # no drop path in the teacher: the same output twice (drop_path_rate=0.5)
    assert torch.equal(got, again)
    assert torch.allclose(got.view(-1, K), want, atol=1e-5)
    model.eval()
    assert not any(m.training for m in bns)
    with torch.no_grad():
        frozen = model._embed(model.teacher, views)
    assert not torch.allclose(frozen, got, atol=1e-3)  # running statistics now


def test_teacher_moves_by_the_ema_rule_every_step():
    torch.manual_seed(0)
    model = tiny_dino()
    model.init_weights()
    assert all(torch.equal(a, b) for a, b in zip(model.teacher.parameters(),
                                                  model._student().parameters()))
    with torch.no_grad():  # make teacher and student differ
        for p in model._student().parameters():
            p.add_(0.01 * torch.randn_like(p))
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.5))
    model.train()
    m = model.teacher_momentum
    for _ in range(2):
        teacher, student = params(model.teacher), params(model._student())
        model.train_step(batch(), optim)
        after = params(model.teacher)
        for name, value in after.items():
            want = m * teacher[name] + (1 - m) * student[name]
            # float32, evaluated in another order than the in-place update: equal
            # to a few units in the last place (~6e-8 relative each)
            assert torch.allclose(value, want, rtol=5e-7, atol=1e-8), name
        # the student moved (so the next step's EMA target is new)
        assert any(not torch.equal(student[k], v)
                   for k, v in params(model._student()).items())


def test_multicrop_routes_views_like_separate_forwards():
    torch.manual_seed(0)
    model = tiny_dino().eval()
    views = model.data_preprocessor(batch(), False)['inputs']
    logits = model._embed(model._student(), views)
    assert logits.shape == (len(views), 2, K)
    for i, view in enumerate(views):
        alone = model.head(model.backbone(view)[-1])
        assert torch.allclose(logits[i], alone, atol=1e-5)


def test_bad_inputs_raise():
    model = tiny_dino()
    with pytest.raises(ValueError, match='at least 2 views'):
        model.loss(torch.zeros(2, 3, 32, 32), [])
    with pytest.raises(ValueError, match='share one shape'):
        model.loss([torch.zeros(2, 3, 32, 32), torch.zeros(2, 3, 16, 16),
                    torch.zeros(2, 3, 16, 16)], [])
    with pytest.raises(ValueError, match='teacher_momentum'):
        tiny_dino(teacher_momentum=1.5)


def test_head_weight_norm_and_frozen_gain():
    torch.manual_seed(0)
    head = DINOHead(8, out_channels=10, hidden_channels=16, bottleneck_channels=4,
                    use_bn=True)
    x = torch.randn(6, 8)
    out = head(x)
    # logits are cosine similarities between the L2-normalised bottleneck and unit
    # prototypes: |logit| <= 1 with norm_last_layer
    assert out.shape == (6, 10) and out.abs().max() <= 1 + 1e-6
    weight = head.last_layer.weight
    assert torch.allclose(weight.norm(dim=1), torch.ones(10), atol=1e-6)
    gain = head.last_layer.parametrizations.weight.original0
    assert not gain.requires_grad
    assert DINOHead(8, 10, norm_last_layer=False).last_layer.parametrizations.weight \
        .original0.requires_grad
    assert isinstance(copy.deepcopy(head), DINOHead)
    with pytest.raises(ValueError, match='num_layers'):
        DINOHead(8, num_layers=0)
    with pytest.raises(ValueError, match='batch, channels'):
        head(torch.randn(2, 3, 8))


def test_teacher_update_equals_the_per_tensor_loop_bit_for_bit():
    """update_teacher's multi-tensor ops do per tensor what the plain loop
    ``t.mul_(m).add_(s, alpha=1 - m)`` does: the same values, bit for bit."""
    model = tiny_dino(teacher_momentum=0.9)
    model.init_weights()
    with torch.no_grad():
        for p in model._student().parameters():
            p.add_(0.01 * torch.randn_like(p))
    loop = copy.deepcopy(model.teacher)
    student = dict(model._student().named_parameters())
    with torch.no_grad():
        for name, t in loop.named_parameters():
            t.mul_(0.9).add_(student[name], alpha=1 - 0.9)
    model.update_teacher()
    for (name, a), b in zip(model.teacher.named_parameters(), loop.parameters()):
        assert torch.equal(a, b), name
