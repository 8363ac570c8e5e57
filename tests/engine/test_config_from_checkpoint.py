"""A config stored in a checkpoint is read as data, never run.

mmengine's ``BaseInferencer`` (mmdet's ``DetInferencer``, mmseg's
``MMSegInferencer``) given ``model=None, weights=FILE`` ran the file's
``message_hub['runtime_info']['cfg']`` (or ``meta['cfg']``) through
``Config.fromstring``, and ``Runner.resume`` its ``meta['config']``: a file of
strings only, admitted by ``weights_only``, ran code. Each test plants such a file,
whose config writes a marker when it is run, and checks the entry point refuses it
by name and the marker never appears. mmpretrain's inferencers and ``get_model``
take the config from a name or a file, never from the checkpoint (checked below).
"""
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config

import mmdinomamba  # noqa: F401  (reads stored configs as data)
from mmdinomamba.utils import UnsafeConfigError, checkpoint_config, config_from_text

from tests.helpers.checkpoint_files import payload
from tests.helpers.toy_training import ENV, ROOT

TINY = dict(type='ImageClassifier',
            backbone=dict(type='DinoVim', arch=dict(embed_dims=16, num_layers=1),
                          img_size=16, patch_size=8,
                          mixer_cfg=dict(d_state=4, headdim=8)),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(type='LinearClsHead', num_classes=2, in_channels=16))


def planted(tmp_path, where: str = 'message_hub', text: str = None):
    """A checkpoint of strings only whose stored config writes a marker when run."""
    marker = str(tmp_path / f'{where}.ran')
    text = text or f"model = dict(type='ImageClassifier')\nx = {payload(marker)}\n"
    checkpoint = dict(state_dict={'w': torch.zeros(1)}, meta=dict(epoch=1, iter=1))
    if where == 'message_hub':
        checkpoint['message_hub'] = dict(runtime_info=dict(cfg=text))
    else:
        checkpoint['meta'][where] = text
    path = str(tmp_path / f'{where}.pth')
    torch.save(checkpoint, path)
    return path, marker


def test_control_mmengine_runs_the_planted_config(tmp_path):
    """What the inferencers did with the file's text: it writes the marker."""
    path, marker = planted(tmp_path)
    text = torch.load(path)['message_hub']['runtime_info']['cfg']
    Config.fromstring(text, file_format='.py')
    assert open(marker).read() == 'ran'


# -- the reader ------------------------------------------------------------------------

@pytest.mark.parametrize('config', [
    'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py',
    'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py',
    'configs/compare/linear-probe_vit-d192-l12-p8_1xb128-30e_toy-rich.py',
    'configs/upernet/upernet_dinovim-tiny-p16_8xb2-160k_ade20k-512x512.py',
])
def test_the_dump_of_a_shipped_config_reads_as_mmengine_reads_it(config):
    """A data-only text gives what ``Config.fromstring`` (which runs it) gives."""
    text = Config.fromfile(osp.join(ROOT, config)).pretty_text
    assert config_from_text(text).to_dict() == \
        Config.fromstring(text, file_format='.py').to_dict()


@pytest.mark.parametrize('line, what', [
    ("x = __import__('os').system('true')", "__import__\\('os'\\).* is code"),
    ('import os', "'import os' is not `name = value`"),
    ("x = open('f', 'w')", "open\\('f', 'w'\\).* is code"),
    ('x = [i for i in range(3)]', 'is code, not data'),
    ('x = dict(**y)', 'is code, not data'),
    ('x = {**y}', 'unpacks a mapping'),
    ("x = f'{y}'", 'is code, not data'),
    ('x = 2 ** 100000', 'is code, not data'),
    ('x = y', "'y' is code"),
    ("x = ().__class__", 'is code, not data'),
    ("_base_ = ['a.py']", '`_base_` names other files'),
    ('x, y = 1, 2', 'is not `name = value`'),
    ('def f(): pass', 'is not `name = value`'),
])
def test_code_in_a_stored_config_is_refused_naming_the_line(line, what):
    text = f"model = dict(type='X', depth=-2, scale=(1.0, ), on=True, v=None)\n{line}\n"
    with pytest.raises(UnsafeConfigError,
                       match=f'refusing to read the config in ckpt.pth: line 2, .*{what}'):
        config_from_text(text, 'ckpt.pth')


def test_checkpoint_config_reads_where_mmengine_reads(tmp_path):
    text = "model = dict(type='ImageClassifier', depth=-2)\n"
    for where in ('message_hub', 'cfg'):
        path, _ = planted(tmp_path, where, text)
        assert checkpoint_config(torch.load(path), path).model.depth == -2
    with pytest.raises(ValueError, match='stores no config'):
        checkpoint_config({'state_dict': {}}, 'x.pth')


# -- the entry points ------------------------------------------------------------------

def inferencers():
    """The upstream inferencers that take their config from the checkpoint."""
    found = []
    for module, name in (('mmdet.apis', 'DetInferencer'),
                         ('mmseg.apis', 'MMSegInferencer')):
        try:
            found.append(getattr(__import__(module, fromlist=[name]), name))
        except ImportError:
            pass
    return found


@pytest.mark.parametrize('where', ['message_hub', 'cfg'])
def test_inferencers_refuse_a_planted_config(tmp_path, where):
    classes = inferencers()
    assert classes, 'mmdet or mmseg is installed with the dense extras'
    for cls in classes:
        path, marker = planted(tmp_path, where)
        with pytest.raises(UnsafeConfigError, match=f'refusing to read the config in '
                           f'{path}: line 2'):
            cls(model=None, weights=path, device='cpu')
        assert not osp.exists(marker), cls.__name__


class TinyInferencer:
    """mmengine's ``BaseInferencer`` with its abstract steps filled in."""

    @staticmethod
    def make():
        from mmengine.infer import BaseInferencer

        class Tiny(BaseInferencer):
            def _init_pipeline(self, cfg):
                return lambda x: x

            def visualize(self, *args, **kwargs):
                return None

            def postprocess(self, *args, **kwargs):
                return None

        return Tiny


def test_base_inferencer_builds_the_model_from_a_data_config(tmp_path):
    """The same entry point reads a config dump as data and loads the weights."""
    from mmpretrain.registry import MODELS
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(TINY)
    text = Config(dict(model=TINY, default_scope='mmpretrain')).pretty_text
    path = str(tmp_path / 'tiny.pth')
    torch.save(dict(state_dict=model.state_dict(), meta=dict(cfg=text)), path)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        inferencer = TinyInferencer.make()(model=None, weights=path, device='cpu')
        assert inferencer.cfg.model.backbone.arch.embed_dims == 16
        for key, value in model.state_dict().items():
            assert torch.equal(inferencer.model.state_dict()[key], value), key
        path, marker = planted(tmp_path)
        with pytest.raises(UnsafeConfigError):
            TinyInferencer.make()(model=None, weights=path, device='cpu')
    assert not osp.exists(marker)


def test_resume_reads_meta_config_as_data(tmp_path):
    """Runner.resume runs ``meta['config']`` for its gpu_ids: the loaded text is
    read as data first and reduced to that line; code is refused."""
    from mmengine.runner import Runner
    runner = SimpleNamespace(model=torch.nn.Linear(1, 1), call_hook=lambda *a, **k: None,
                             logger=SimpleNamespace(info=print))
    torch.save(dict(state_dict=runner.model.state_dict(),
                    meta=dict(config="gpu_ids = [0, 1]\nlr = 0.1\n")),
               tmp_path / 'data.pth')
    checkpoint = Runner.load_checkpoint(runner, str(tmp_path / 'data.pth'))
    assert checkpoint['meta']['config'] == 'gpu_ids = [0, 1]'
    path, marker = planted(tmp_path, 'config')
    with pytest.raises(UnsafeConfigError, match=f"config in {path} .meta\\['config'\\]"):
        Runner.load_checkpoint(runner, path)
    assert not osp.exists(marker)


@pytest.mark.slow
def test_train_tool_resume_refuses_a_planted_config(tmp_path, toy_root):
    """``tools/train.py --resume`` on a file whose meta['config'] runs code: exit
    1, the refusal named, no marker."""
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS

    from tests.helpers.toy_training import tiny_dino_config
    cfg = tiny_dino_config(toy_root, str(tmp_path / 'work'), max_epochs=1,
                           num_workers=0)
    config = str(tmp_path / 'dino.py')
    cfg.dump(config)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        state = MODELS.build(cfg.model).state_dict()
    marker = str(tmp_path / 'ran')
    path = str(tmp_path / 'epoch_1.pth')
    torch.save(dict(state_dict=state, meta=dict(
        epoch=1, iter=1, config=f'gpu_ids = {payload(marker)}\n')), path)
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools/train.py'), config, '--resume', path],
        env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert f"refusing to read the config in {path} (meta['config'])" in output
    assert not osp.exists(marker)


def test_mmpretrain_takes_no_config_from_a_checkpoint(tmp_path):
    """mmpretrain's get_model and inferencers build from a name, a config or a
    model, never from the checkpoint's text: a planted file passed as weights
    loads as weights and runs nothing."""
    import glob

    import mmpretrain.apis
    from mmpretrain.apis import get_model
    sources = glob.glob(osp.join(osp.dirname(mmpretrain.apis.__file__), '*.py'))
    assert len(sources) > 5  # model.py, base.py and every inferencer
    for source in sources:
        text = open(source).read()
        assert 'fromstring' not in text and "['cfg']" not in text, source
    path, marker = planted(tmp_path)
    with pytest.raises(Exception):
        get_model(path)  # a checkpoint is not a model name or a config
    assert not osp.exists(marker)
