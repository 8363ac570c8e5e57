"""Non-finite training stops before it destroys anything (NonFiniteStopHook, and
ResumableCheckpointHook's refusal to write non-finite weights).

The process tests put a NaN into a DINO run (DinoVim, and mmpretrain's ViT) at the
last iteration of epoch 2, with ``max_keep_ckpts=1`` and the backbones' own
finiteness checks off as on CUDA: without the hook, epoch_2.pth would hold NaN
weights and epoch_1.pth would be deleted.
"""
import glob
import os.path as osp
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.logging import MessageHub, MMLogger
from mmengine.optim import OptimWrapper

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.engine import NonFiniteStopHook, non_finite
from mmdinomamba.utils import load_checkpoint_file

from tests.helpers.configs import leaf_configs, load
from tests.helpers.toy_training import tiny_dino_config, train_process

NAN_ITER = 8  # the last of epoch 2 (4 iterations an epoch)


# -- the fused check ---------------------------------------------------------------------

def test_non_finite_names_what_an_elementwise_check_names():
    torch.manual_seed(0)
    named = []
    for i in range(40):
        dtype = (torch.float32, torch.float16, torch.float64)[i % 3]
        t = torch.randn(int(torch.randint(1, 50, ())), dtype=dtype)
        if i % 5 == 1:
            t[int(torch.randint(0, t.numel(), ()))] = float('nan')
        elif i % 5 == 2:
            t[-1] = float('-inf') if i % 2 else float('inf')
        elif i % 5 == 3:  # large but finite: a norm would overflow, the check not
            t[0] = 6e4 if dtype == torch.float16 else 1e30
        named.append((f't{i}', t))
    named += [('steps', torch.arange(5)), ('empty', torch.zeros(0)), ('meta', 3.0)]
    expected = [n for n, t in named if torch.is_tensor(t) and t.is_floating_point()
                and not torch.isfinite(t).all()]
    assert expected and non_finite(named) == expected
    assert non_finite([(n, t) for n, t in named if n not in expected]) == []


# -- the hook, on one step -----------------------------------------------------------------

class TwoLayers(nn.Module):

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.fc2(self.fc1(x))


@pytest.fixture
def step():
    """One training step through the hook: returns run(poison=..., step=...)."""
    torch.manual_seed(0)
    model = TwoLayers()
    runner = SimpleNamespace(
        model=model, optim_wrapper=OptimWrapper(torch.optim.SGD(model.parameters(),
                                                                lr=0.1)),
        iter=3, epoch=0, train_loop=object(),
        message_hub=MessageHub.get_instance('non-finite-unit'),
        logger=MMLogger.get_instance('non-finite-unit', log_level='CRITICAL'))
    hook = NonFiniteStopHook()
    hook.before_train(runner)

    def run(grad=None, loss=None, stepped=True):
        hook.before_train_iter(runner, 0)
        out = model(torch.ones(2, 3)).sum()
        out.backward()
        if grad is not None:
            model.fc2.weight.grad[0, 1] = grad
        if stepped:  # an AMP loss scaler skips the step on overflowing gradients
            runner.optim_wrapper.step()
        runner.optim_wrapper.zero_grad()
        value = out.detach() if loss is None else torch.tensor(loss)
        hook.after_train_iter(runner, 0, outputs=dict(loss=value, loss_x=value))

    yield run
    hook.after_train(runner)


def test_finite_steps_pass(step):
    step()
    step(grad=1e30)


def test_non_finite_gradient_names_iteration_and_tensor(step):
    with pytest.raises(FloatingPointError,
                       match=r'stopped at iteration 4: first non-finite gradient: '
                       r'fc2\.weight\. Nothing of this iteration was saved'):
        step(grad=float('inf'))


def test_non_finite_loss_stops_even_when_the_step_is_skipped(step):
    with pytest.raises(FloatingPointError,
                       match=r'iteration 4: non-finite loss loss=nan, loss_x=nan\.'):
        step(loss=float('nan'), stepped=False)


def test_overflow_skipped_by_the_loss_scaler_is_not_a_failure(step):
    step(grad=float('inf'), stepped=False)


# -- real runs ------------------------------------------------------------------------------

def vit_backbone():
    return dict(type='mmpretrain.VisionTransformer',
                arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                          feedforward_channels=64),
                img_size=32, patch_size=8, out_type='cls_token', drop_path_rate=0.1)


def write_config(toy_root, work_dir, backbone, stop_hook=True):
    cfg = tiny_dino_config(toy_root, str(work_dir), max_epochs=3, num_workers=0)
    if backbone == 'vit':
        cfg.model.backbone = ConfigDict(vit_backbone())
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=1)
    assert cfg.default_hooks.non_finite.type == 'NonFiniteStopHook'  # as shipped
    if not stop_hook:
        del cfg.default_hooks['non_finite']
    path = str(work_dir / 'cfg.py')
    cfg.dump(path)
    return path



def all_finite(path):
    state = load_checkpoint_file(str(path), map_location='cpu')['state_dict']
    return non_finite(state.items()) == []


def failed_nan_run(toy_root, tmp_path, backbone, **config_kwargs):
    """``tools/train.py`` on ``write_config``'s config with a NaN at ``NAN_ITER``:
    the config and the run's output, once it has exited non-zero."""
    config = write_config(toy_root, tmp_path, backbone, **config_kwargs)
    proc = train_process(config, '--work-dir', str(tmp_path),
                         fault=('nan-at-iter', str(NAN_ITER)))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    return config, output


@pytest.mark.slow
@pytest.mark.parametrize('backbone', ['dinovim', 'vit'])
def test_nan_run_stops_keeping_the_last_good_checkpoint(toy_root, tmp_path, backbone):
    config, output = failed_nan_run(toy_root, tmp_path, backbone)
    assert (f'NonFiniteStopHook: training stopped at iteration {NAN_ITER} (epoch 2, '
            'batch 4 of 4): non-finite loss loss=nan') in output, output[-3000:]
    assert 'first non-finite gradient: backbone.' in output
    good = tmp_path / 'epoch_1.pth'
    assert f'the last checkpoint, {good}, is kept' in output
    # nothing of epoch 2 written, epoch 1 kept although max_keep_ckpts=1
    assert sorted(glob.glob(str(tmp_path / '*.pth'))) == [
        str(tmp_path / 'epoch_1.pth'), str(tmp_path / 'init.pth')]
    assert (tmp_path / 'last_checkpoint').read_text() == str(good)
    assert all_finite(good)
    # ... and it resumes to the end
    proc = train_process(config, '--work-dir', str(tmp_path), '--resume')
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert all_finite(tmp_path / 'epoch_3.pth')
    assert not osp.exists(good)  # max_keep_ckpts=1 again, now that epoch 3 is good


@pytest.mark.slow
def test_without_the_hook_the_checkpoint_hook_refuses_nan_weights(toy_root, tmp_path):
    """The second line: ResumableCheckpointHook writes no non-finite weights and
    deletes nothing."""
    _, output = failed_nan_run(toy_root, tmp_path, 'dinovim', stop_hook=False)
    assert (f'ResumableCheckpointHook: not writing {tmp_path / "epoch_2.pth"}: the '
            'model holds NaN or infinite values') in output, output[-3000:]
    assert f'The last good checkpoint, {tmp_path / "epoch_1.pth"}, is kept' in output
    assert not osp.exists(tmp_path / 'epoch_2.pth')
    assert all_finite(tmp_path / 'epoch_1.pth')


def test_every_training_config_stops_on_non_finite_values():
    """Every shipped config that trains selects the hook (DINO with every
    backbone, probes, dense)."""
    checked = 0
    for path in leaf_configs():
        cfg = load(path)
        if not (cfg.get('train_cfg') and cfg.get('train_dataloader')):
            continue
        hooks = [h.get('type') for h in (cfg.get('default_hooks') or {}).values() if h]
        hooks += [h.get('type') for h in cfg.get('custom_hooks') or []]
        assert 'NonFiniteStopHook' in hooks, path
        checked += 1
    assert checked >= 60
