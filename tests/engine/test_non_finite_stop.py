"""Non-finite training stops before it destroys anything (NonFiniteStopHook, and
ResumableCheckpointHook's refusal to write non-finite weights).

The process tests put a NaN into a DINO run (DinoVim, and mmpretrain's ViT) at the
last iteration of epoch 2, with ``max_keep_ckpts=1``, on the CPU: the hook reports
it (iteration, layer, likely cause) before the ops' own checks would; without the
hook, and with those checks off as on CUDA, epoch_2.pth would hold NaN weights and
epoch_1.pth would be deleted.
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
        self.data_preprocessor = nn.Identity()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.fc2(self.fc1(self.data_preprocessor(x)))

    def train_step(self, x):  # what the hook wraps (as mmengine's BaseModel's)
        return self(x)


def one_step_runner(model, name):
    """A runner stand-in for the hook's one-step tests."""
    return SimpleNamespace(
        model=model, optim_wrapper=OptimWrapper(torch.optim.SGD(model.parameters(),
                                                                lr=0.1)),
        iter=3, epoch=0, train_loop=object(),
        message_hub=MessageHub.get_instance(name),
        logger=MMLogger.get_instance(name, log_level='CRITICAL'))


@pytest.fixture
def step():
    """One training step through the hook: returns run(grad=..., loss=...,
    stepped=..., x=..., poison=...)."""
    torch.manual_seed(0)
    model = TwoLayers()
    runner = one_step_runner(model, 'non-finite-unit')
    hook = NonFiniteStopHook()
    hook.before_train(runner)

    def run(grad=None, loss=None, stepped=True, x=None, poison=None):
        if poison is not None:
            with torch.no_grad():
                poison(model)
        hook.before_train_iter(runner, 0)
        out = model.train_step(torch.ones(2, 3) if x is None else x).sum()
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


def test_non_finite_gradient_names_iteration_tensor_layer_and_cause(step):
    with pytest.raises(FloatingPointError,
                       match=r'stopped at iteration 4: first non-finite gradient: '
                       r'fc2\.weight\. Layer: fc2; likely cause: the backward pass '
                       r'overflowed: .*\. Nothing of this iteration was saved'):
        step(grad=float('inf'))


def test_non_finite_loss_stops_even_when_the_step_is_skipped(step):
    with pytest.raises(FloatingPointError,
                       match=r'iteration 4: non-finite loss loss=nan, loss_x=nan\. '
                       r'Layer: the loss; likely cause: the loss is non-finite '
                       r'although every watched layer returned finite values'):
        step(loss=float('nan'), stepped=False)


def test_forward_overflow_names_the_layer(step):
    def ones(model):
        model.fc1.weight.fill_(1.0)  # finite weights, finite input: 9e38 overflows

    with pytest.raises(FloatingPointError,
                       match=r'iteration 4: non-finite loss loss=.*Layer: fc1; likely '
                       r'cause: the forward pass overflowed here from finite weights '
                       r'and finite inputs'):
        step(x=torch.full((2, 3), 3e38), poison=ones)


def test_non_finite_weights_before_the_iteration_are_the_cause(step):
    def nan(model):
        model.fc2.bias.fill_(float('nan'))

    with pytest.raises(FloatingPointError,
                       match=r'Layer: fc2; likely cause: its weights were already '
                       r'non-finite when the iteration started \(fc2\.bias, 1 tensor '
                       r'in all\)'):
        step(poison=nan)


def test_a_non_finite_batch_is_the_cause(step):
    x = torch.ones(2, 3)
    x[1, 2] = float('inf')
    with pytest.raises(FloatingPointError,
                       match=r'Layer: data_preprocessor; likely cause: the input batch '
                       r'holds NaN or infinite values'):
        step(x=x)


def test_overflow_skipped_by_the_loss_scaler_is_not_a_failure(step):
    step(grad=float('inf'), stepped=False)


class TinyDinoVimClassifier(nn.Module):
    """A 2-block DinoVim and a linear readout: ``forward(images)`` is the loss."""

    def __init__(self):
        super().__init__()
        from tests.factories import dinovim
        self.data_preprocessor = nn.Identity()
        self.backbone = dinovim(embed_dims=32, num_layers=2, img_size=32,
                                patch_size=8, drop_path_rate=0.0)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        feats = self.backbone(self.data_preprocessor(x))[-1]
        return self.head(feats.reshape(feats.shape[0], -1)[:, :32]).square().mean()

    def train_step(self, x):  # what the hook wraps (as mmengine's BaseModel's)
        return self(x)


def dinovim_step(poison):
    """One CPU training step of TinyDinoVimClassifier through the hook, with
    ``poison`` applied to the model first; returns the hook's error message."""
    model = TinyDinoVimClassifier()
    runner = one_step_runner(model, 'non-finite-dinovim')
    hook = NonFiniteStopHook()
    hook.before_train(runner)
    with torch.no_grad():
        poison(model)
    try:
        hook.before_train_iter(runner, 0)
        loss = model.train_step(torch.rand(2, 3, 32, 32))
        loss.backward()
        runner.optim_wrapper.step()
        with pytest.raises(FloatingPointError) as error:
            hook.after_train_iter(runner, 0, outputs=dict(loss=loss.detach()))
    finally:
        hook.after_train(runner)
    return str(error.value)


def test_on_the_cpu_the_hook_reports_what_the_ops_would_raise():
    """A NaN weight in the first block: on the CPU the next block's mixer raises
    its own ValueError (no iteration, layer, cause) at the API level; in a
    training iteration the hook reports it instead."""
    def nan_in_first_block(model):
        next(model.backbone.layers[0].parameters()).view(-1)[0] = float('nan')

    model = TinyDinoVimClassifier()
    with torch.no_grad():
        nan_in_first_block(model)
        with pytest.raises(ValueError, match='contains NaN or Inf values'):
            model(torch.rand(2, 3, 32, 32))  # the API: the ops' check, as before
    message = dinovim_step(nan_in_first_block)
    assert 'training stopped at iteration 4' in message
    assert 'Layer: backbone.layers.0' in message
    assert 'likely cause: its weights were already non-finite' in message
    # the ops' checks are on again after the iteration
    with torch.no_grad(), pytest.raises(ValueError, match='contains NaN or Inf'):
        model(torch.rand(2, 3, 32, 32))


def test_the_ops_checks_are_on_again_after_a_step_that_raised():
    """The ops' checks are off inside train_step only, whatever ends it."""
    from mmdinomamba.ops import backend
    model = TwoLayers()
    seen = []

    def broken(x):
        seen.append(backend._FINITE_CHECKS[0])
        raise RuntimeError('a broken batch')

    model.train_step = broken
    runner = one_step_runner(model, 'non-finite-raise')
    hook = NonFiniteStopHook()
    hook.before_train(runner)
    with pytest.raises(RuntimeError, match='a broken batch'):
        runner.model.train_step(torch.ones(2, 3))
    assert seen == [False] and backend._FINITE_CHECKS[0]
    hook.after_train(runner)
    assert model.train_step is broken  # the model's own back


def test_a_nan_made_in_the_last_block_is_named():
    """Finite weights large enough that the last block overflows: nothing checks
    a block's output at the API level; the hook names the block."""
    def huge_last_block(model):
        for p in model.backbone.layers[-1].parameters():
            if p.dim() > 1:
                p.fill_(1e30)

    message = dinovim_step(huge_last_block)
    assert 'Layer: backbone.layers.1' in message, message
    assert 'likely cause: the forward pass overflowed here' in message


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


def failed_nan_run(toy_root, tmp_path, backbone, fault='nan-at-iter',
                   **config_kwargs):
    """``tools/train.py`` on ``write_config``'s config with a NaN at ``NAN_ITER``:
    the config and the run's output, once it has exited non-zero."""
    config = write_config(toy_root, tmp_path, backbone, **config_kwargs)
    proc = train_process(config, '--work-dir', str(tmp_path),
                         fault=(fault, str(NAN_ITER)))
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
    # on the CPU, with the ops' own checks as they are: the layer and the cause
    assert 'Layer: backbone' in output
    assert ('likely cause: its weights were already non-finite when the iteration '
            'started (backbone.') in output
    assert 'contains NaN or Inf values' not in output  # no op's error first
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
    # the ops' own checks off, as on CUDA (on the CPU they would raise first)
    _, output = failed_nan_run(toy_root, tmp_path, 'dinovim', stop_hook=False,
                               fault='nan-at-iter-unchecked')
    assert (f'ResumableCheckpointHook: not writing {tmp_path / "epoch_2.pth"}: the '
            'model holds NaN or infinite values') in output, output[-3000:]
    assert f'The last good checkpoint, {tmp_path / "epoch_1.pth"}, is kept' in output
    assert not osp.exists(tmp_path / 'epoch_2.pth')
    assert all_finite(tmp_path / 'epoch_1.pth')



@pytest.mark.gpu
@pytest.mark.parametrize('mode', ['eager', 'graphs', 'compile'])
def test_on_cuda_the_hook_watches_eager_graphed_and_compiled_blocks(mode):
    """On CUDA, with the blocks replayed from CUDA graphs or compiled: finite steps
    pass (the watchers record nothing into a capture or a trace), and a NaN weight
    is reported with its layer and cause."""
    from mmdinomamba.engine.graphed_blocks import graph_blocks
    model = TinyDinoVimClassifier().cuda()
    if mode == 'graphs':
        graph_blocks(model)
    elif mode == 'compile':
        model.backbone.compile()
    runner = one_step_runner(model, f'non-finite-cuda-{mode}')
    hook = NonFiniteStopHook()
    hook.before_train(runner)
    x = torch.rand(2, 3, 32, 32, device='cuda')

    def step():
        hook.before_train_iter(runner, 0)
        loss = model.train_step(x)
        loss.backward()
        runner.optim_wrapper.step()
        runner.optim_wrapper.zero_grad()
        hook.after_train_iter(runner, 0, outputs=dict(loss=loss.detach()))

    try:
        for _ in range(3):  # warm-up, capture or compile, replays
            step()
        with torch.no_grad():
            model.backbone.patch_embed.proj.weight.view(-1)[0] = float('nan')
        with pytest.raises(FloatingPointError,
                           match=r'Layer: backbone\.patch_embed\.proj; likely '
                           r'cause: its weights were already non-finite'):
            step()
    finally:
        hook.after_train(runner)
