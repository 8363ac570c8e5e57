"""No checkpoint runs code, through every entry point that takes a file.

Two attack files (tests/helpers/checkpoint_files.py), each a real training checkpoint
with a payload that writes a marker file: the classic ``__reduce__`` pickle and the
allow-list gadget (a HistoryBuffer whose ``__reduce_ex__`` a resume's deep copy
calls). A control shows that the gadget does run under the previous allow-list
(plain ``builtins.getattr``). Every entry point must refuse both, naming the file,
and leave no marker. Entry points whose process is the point (``tools/train.py
--resume``, ``load_from``, ``init_cfg``; ``tools/test.py``) run as processes.
"""
import argparse
import copyreg
import os
import os.path as osp
import subprocess
import sys
import types
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.logging import HistoryBuffer

import mmdinomamba  # noqa: F401  (registers the allow-list)
from mmdinomamba.utils import (InertRecord, UnsafeCheckpointError, checkpoint_safe_globals,
                               load_checkpoint_file, load_official_checkpoint)

from tests.factories import dinovim
from tests.helpers import checkpoint_files as attack
from tests.helpers.toy_training import ENV, ROOT, tiny_dino_config, train

PROBE = osp.join(ROOT, 'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py')
ATTACKS = ('gadget', 'classic')


@pytest.fixture(scope='module')
def trained(toy_root, tmp_path_factory):
    """A one-epoch tiny DINO run: its config file and checkpoint."""
    work_dir = tmp_path_factory.mktemp('trained')
    cfg = tiny_dino_config(toy_root, str(work_dir), max_epochs=1, num_workers=0)
    config = str(work_dir / 'cfg.py')
    cfg.dump(config)
    train(cfg, 'safety-trained')
    return config, str(work_dir / 'epoch_1.pth')


@pytest.fixture(scope='module')
def probe_config(toy_root, tmp_path_factory):
    """The toy linear probe on the 2-class toy data, backbone from scratch."""
    cfg = Config.fromfile(PROBE)
    cfg.model.head.num_classes = cfg.data_preprocessor.num_classes = 2
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=toy_root,
                                   classes=osp.join(toy_root, 'classes.txt'))
        cfg[loader].num_workers = 0
    cfg.train_cfg.max_epochs = 1
    cfg.param_scheduler = []
    cfg.log_level = 'WARNING'
    path = str(tmp_path_factory.mktemp('probe') / 'probe.py')
    cfg.dump(path)
    return path


@pytest.fixture(scope='module')
def attack_files(trained, tmp_path_factory):
    """name -> (path, marker) of each attack file; the markers do not exist."""
    folder = tmp_path_factory.mktemp('attacks')
    checkpoint = load_checkpoint_file(trained[1], map_location='cpu')
    files = {}
    for name, make in (('gadget', attack.with_gadget), ('classic', attack.with_classic)):
        path, marker = str(folder / f'{name}.pth'), str(folder / f'{name}.ran')
        torch.save(make(checkpoint, marker), path)
        files[name] = path, marker
    return files


def refused(text: str, path: str) -> bool:
    return f'refusing to load {path}' in text


# -- the files are real attacks ------------------------------------------------------

# the previous allow-list: the same data types, and plain builtins.getattr
CONTROL = """
import copy, sys
import numpy as np, torch
from mmengine.logging import HistoryBuffer
core = np._core if hasattr(np, '_core') else np.core
types = [getattr, HistoryBuffer, np.ndarray, np.dtype, core.multiarray._reconstruct,
         core.multiarray.scalar]
for name in ('float64', 'float32', 'float16', 'int64', 'int32', 'bool_'):
    types += [getattr(np, name), type(np.dtype(getattr(np, name)))]
torch.serialization.add_safe_globals(types)
checkpoint = torch.load(sys.argv[1], weights_only=True)
copy.deepcopy(checkpoint['message_hub']['runtime_info'])
"""


@pytest.mark.slow
def test_control_the_gadget_runs_under_an_allow_list_with_plain_getattr(attack_files):
    """The previous allow-list: the file loads, and resume's deep copy runs eval."""
    path, marker = attack_files['gadget']
    proc = subprocess.run([sys.executable, '-c', CONTROL, path], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert open(marker).read() == 'ran'
    os.remove(marker)


# -- entry points that are processes ---------------------------------------------------

def run_tool(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], env=ENV, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize('entry', ['resume', 'load_from', 'init_cfg', 'test'])
@pytest.mark.parametrize('name', ATTACKS)
def test_tools_refuse_attack_files(entry, name, trained, probe_config, attack_files,
                                   tmp_path):
    path, marker = attack_files[name]
    train_py, test_py = osp.join(ROOT, 'tools/train.py'), osp.join(ROOT, 'tools/test.py')
    work = ['--work-dir', str(tmp_path / 'work')]
    args = {
        'resume': [train_py, trained[0], *work, '--resume', path],
        'load_from': [train_py, trained[0], *work, '--cfg-options', f'load_from={path}'],
        'init_cfg': [train_py, probe_config, *work, '--cfg-options',
                     f'model.backbone.init_cfg.checkpoint={path}'],
        'test': [test_py, probe_config, path, *work],
    }[entry]
    proc = run_tool(*args)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert refused(output, path), output[-3000:]
    assert not osp.exists(marker)


# -- entry points that are functions -----------------------------------------------------

@pytest.mark.parametrize('name', ATTACKS)
def test_converters_refuse_attack_files(name, attack_files, load_tool, tmp_path, capsys):
    path, marker = attack_files[name]
    for tool in ('dinomamba2mmdinomamba', 'extract_teacher'):
        module = load_tool(f'tools/model_converters/{tool}.py')
        out = str(tmp_path / f'{tool}.pth')
        with pytest.raises(SystemExit) as exit_info:
            module.main([path, out])
        assert exit_info.value.code != 0
        assert refused(capsys.readouterr().err, path), tool
        assert not osp.exists(out) and not osp.exists(marker)


@pytest.mark.parametrize('name', ATTACKS)
def test_analysis_tools_refuse_attack_files(name, attack_files, load_tool, tmp_path):
    path, marker = attack_files[name]
    calls = {
        'mixer_rank': [osp.join(ROOT, 'configs/analysis/dinovim-mini_p16_128px.py'),
                       path, '--toy', '--num-images', '1', '--out-dir',
                       str(tmp_path / 'rank'), '--device', 'cpu'],
        'activation_maps': [
            osp.join(ROOT, 'configs/binary_auc/binary-auc_dinovim-toy-p8_toy.py'),
            path, '--out-dir', str(tmp_path / 'maps'), '--device', 'cpu'],
    }
    for tool, argv in calls.items():
        module = load_tool(f'tools/analysis/{tool}.py')
        with pytest.raises(UnsafeCheckpointError, match=f'refusing to load {path}'):
            module.main(argv)
        assert not osp.exists(marker)


@pytest.mark.parametrize('name', ATTACKS)
def test_mmengine_and_torch_loaders_refuse_attack_files(name, attack_files):
    """mmengine's load_checkpoint (init_cfg Pretrained of mmpretrain models),
    mmpretrain.get_model(pretrained=) and a plain torch.load (weights_only=True
    by default) after import mmdinomamba."""
    from mmengine.runner import load_checkpoint
    from mmpretrain import get_model
    path, marker = attack_files[name]
    with pytest.raises(UnsafeCheckpointError, match=f'refusing to load {path}'):
        load_checkpoint(torch.nn.Linear(2, 2), path)
    tiny = Config(dict(model=dict(type='ImageClassifier', backbone=dict(
        type='DinoVim', arch=dict(embed_dims=16, num_layers=1), img_size=16,
        patch_size=8, mixer_cfg=dict(d_state=4, headdim=8)))))
    with pytest.raises(UnsafeCheckpointError, match=f'refusing to load {path}'):
        get_model(tiny, pretrained=path)
    with pytest.raises(Exception, match='Weights only load failed'):
        torch.load(path)
    assert not osp.exists(marker)


def test_no_weights_only_false_in_package_and_tools():
    proc = subprocess.run(['grep', '-rn', 'weights_only=False',
                           osp.join(ROOT, 'mmdinomamba'), osp.join(ROOT, 'tools')],
                          capture_output=True, text=True)
    assert proc.stdout == ''


# -- what the allow-list admits ------------------------------------------------------------

UPSTREAM = """
import sys, torch
import mmdinomamba, mmpretrain
from mmengine.config import Config
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader
checkpoint = torch.load(sys.argv[1])  # torch's default: weights_only=True
assert CheckpointLoader.load_checkpoint(sys.argv[1], map_location='cpu').keys() \\
    == checkpoint.keys()
model = mmpretrain.get_model(Config.fromfile(sys.argv[2]), pretrained=sys.argv[1])
key = 'teacher.backbone.pos_embed'
assert torch.equal(model.state_dict()[key], checkpoint['state_dict'][key])
scalars = checkpoint['message_hub']['log_scalars']
assert scalars and all(type(v) is HistoryBuffer for v in scalars.values())
print(sorted(scalars)[0], next(iter(scalars.values())).mean())
"""


@pytest.mark.slow
def test_upstream_loaders_read_train_checkpoints_after_import(trained):
    """In a fresh process, ``import mmdinomamba`` is all that torch.load,
    mmengine's loader and mmpretrain.get_model(pretrained=) need for a
    tools/train.py checkpoint."""
    proc = subprocess.run([sys.executable, '-c', UPSTREAM, trained[1], trained[0]],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'train/' in proc.stdout


def test_history_buffer_round_trip_is_a_plain_history_buffer(tmp_path):
    buffer = HistoryBuffer([1.0, 2.0, 6.0], [1, 1, 1])
    torch.save({'b': buffer}, tmp_path / 'b.pth')
    loaded = load_checkpoint_file(str(tmp_path / 'b.pth'))['b']
    assert type(loaded) is HistoryBuffer
    assert loaded.mean() == 3.0 and loaded.max() == 6.0 and loaded.current() == 6.0
    np.testing.assert_array_equal(loaded.data[0], buffer.data[0])


def saved_buffer_state(tmp_path, **changes):
    buffer = HistoryBuffer([1.0], [1])
    state = dict(buffer.__getstate__(), **changes)
    buffer.__reduce_ex__ = lambda protocol: (copyreg.__newobj__, (HistoryBuffer, ),
                                             state)
    path = str(tmp_path / 'buffer.pth')
    torch.save({'b': buffer}, path)
    return path


@pytest.mark.parametrize('changes, message', [
    (dict(__reduce_ex__=HistoryBuffer.mean), r"sets \['__reduce_ex__'\]"),
    (dict(statistics_methods={'mean': HistoryBuffer.max}),
     "statistic 'mean' is .* not HistoryBuffer's own"),
    (dict(_log_history='text'), 'must be a numeric numpy array'),
])
def test_history_buffer_state_is_checked(tmp_path, changes, message):
    path = saved_buffer_state(tmp_path, **changes)
    with pytest.raises(UnsafeCheckpointError, match=message):
        load_checkpoint_file(path)


def test_getattr_resolves_only_history_buffer_statistics(tmp_path):
    globals_ = dict((name, obj) for obj, name in
                    (g for g in checkpoint_safe_globals() if isinstance(g, tuple)))
    lookup = globals_['builtins.getattr']
    for name in ('min', 'max', 'current', 'mean'):
        assert lookup(HistoryBuffer, name) is getattr(HistoryBuffer, name)
    for owner, name in ((HistoryBuffer, '__init__'), (HistoryBuffer, 'update'),
                        (getattr, '__self__'), ({}, 'get')):
        with pytest.raises(Exception, match='may only look up HistoryBuffer'):
            lookup(owner, name)


# -- numpy: no forgeable dtype ------------------------------------------------------------

@pytest.fixture()
def previous_allow_list():
    """The previous allow-list's numpy entries (numpy's own dtype, array and scalar
    constructors, and the dtype classes BUILD needs) for one test."""
    saved = torch.serialization.get_safe_globals()
    core = np._core if hasattr(np, '_core') else np.core
    old = [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar]
    old += [type(np.dtype(getattr(np, name))) for name in ('float64', 'int64')]
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(old)
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(saved)


def test_control_the_forged_dtype_loads_under_numpys_own_constructors(
        tmp_path, previous_allow_list):
    """The forged file is a real attack: numpy's constructors build a "float64"
    that holds an object field yet claims no objects (its field is never read:
    that would dereference 0x4141414141414141)."""
    path = str(tmp_path / 'forged.pth')
    attack.save_pickle_as_checkpoint(attack.forged_dtype_pickle(), path)
    dtype = torch.load(path, weights_only=True)['array'].dtype
    assert dtype.type is np.float64 and dtype.fields['x'][0] == np.dtype('O')
    assert not dtype.hasobject


@pytest.mark.parametrize('field, message', [
    ('O', r"numpy dtype 'O' .*may only hold numeric numpy dtypes"),
    ('i8', r'numpy dtype state .*only a byte order may be set'),
])
def test_forged_numpy_dtype_is_refused(tmp_path, field, message):
    """BUILD may not give a dtype fields, sizes or flags, and no object dtype is
    built at all: the forged file is refused, by our loader and by a bare
    torch.load after import mmdinomamba."""
    path = str(tmp_path / 'forged.pth')
    attack.save_pickle_as_checkpoint(attack.forged_dtype_pickle(field), path)
    with pytest.raises(UnsafeCheckpointError, match=f'refusing to load {path}: '
                       f'{message}'):
        load_checkpoint_file(path)
    with pytest.raises(Exception, match='Weights only load failed'):
        torch.load(path)


class _Call:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize('value, message', [
    (_Call(np.ndarray, (2, ), np.dtype('f8')), r'numpy\.ndarray\(\.\.\.\)'),
    (_Call(np.dtype, 'V8', False, True), "numpy dtype 'V8'"),
    (_Call(np.dtype, 'f8', True, True), 'align=True'),
    (_Call(np.float64(1).__reduce__()[0], np.dtype('f8'), b'\0' * 4),
     'expected 8 bytes'),
    (np.zeros(2, dtype=object), "numpy dtype 'O8'"),
    (np.zeros(1, dtype=[('a', 'f4')]), 'numpy dtype'),
    (np.str_('text'), "numpy dtype 'U4'"),
])
def test_numpy_values_beyond_numeric_arrays_and_scalars_are_refused(
        tmp_path, value, message):
    path = str(tmp_path / 'value.pth')
    torch.save({'value': value}, path)
    with pytest.raises(UnsafeCheckpointError, match=message):
        load_checkpoint_file(path)


def test_mmengine_numpy_values_load_as_plain_numpy(tmp_path):
    """What mmengine and our hooks save: the message hub (HistoryBuffers of
    float and int scalars, numpy values in runtime_info), the RNG states of
    ResumableCheckpointHook, numpy scalars in meta; every byte order."""
    from mmengine.logging import MessageHub
    from mmdinomamba.engine import get_rng_state
    hub = MessageHub.get_instance('numpy-values-safety')
    for step in range(3):
        hub.update_scalar('train/loss', 0.5 * step)
        hub.update_scalar('train/count', np.int64(step), count=2)
    info = dict(best_score=np.float64(0.8125), history=np.arange(6, dtype='>u4'),
                grid=np.eye(2, dtype=np.float32), dtype=np.dtype('<i2'),
                flags=np.array([True, False]))
    for key, value in info.items():
        hub.update_info(key, value)
    meta = dict(seed=np.int32(7), lr=np.float16(0.25), ok=np.bool_(True),
                z=np.complex64(1 + 2j))
    path = str(tmp_path / 'epoch_1.pth')
    torch.save(dict(message_hub=hub.state_dict(), meta=meta,
                    rng_state=get_rng_state(), state_dict={'w': torch.ones(2)}), path)
    loaded = load_checkpoint_file(path)
    runtime = loaded['message_hub']['runtime_info']
    for key, value in info.items():
        assert type(runtime[key]) is type(value), key
        np.testing.assert_array_equal(runtime[key], value)
    assert runtime['history'].dtype == np.uint32 and runtime['dtype'] == np.int16
    assert {k: (type(v), v) for k, v in loaded['meta'].items()} == \
        {k: (type(v), v) for k, v in meta.items()}
    scalars = loaded['message_hub']['log_scalars']
    assert scalars['train/loss'].mean() == 0.5
    assert type(scalars['train/loss']._log_history) is np.ndarray
    np.testing.assert_array_equal(scalars['train/count'].data[0], [0, 1, 2])
    assert torch.equal(loaded['rng_state']['numpy']['key'],
                       get_rng_state()['numpy']['key'])


# -- files that are not checkpoints ----------------------------------------------------------

def test_empty_and_truncated_files_are_named(tmp_path):
    empty, cut, ok = tmp_path / 'empty.pth', tmp_path / 'cut.pth', tmp_path / 'ok.pth'
    empty.write_bytes(b'')
    torch.save({'w': torch.zeros(1000)}, ok)
    cut.write_bytes(ok.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f'checkpoint {empty} is empty'):
        load_checkpoint_file(str(empty))
    with pytest.raises(ValueError, match=f'cannot read checkpoint {cut}: .*truncated'):
        load_checkpoint_file(str(cut))
    with pytest.raises(FileNotFoundError, match='no such file'):
        load_checkpoint_file(str(tmp_path / 'absent.pth'))


def test_empty_checkpoint_through_init_cfg_and_mmengine_is_named(tmp_path):
    """The bare EOFError of a 0-byte file, in init_cfg and mmengine's loader."""
    from mmengine.runner import load_checkpoint
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    model = dinovim(16, 1, img_size=32, mixer_cfg=dict(d_state=4, headdim=8),
                    init_cfg=dict(type='Pretrained', checkpoint=str(empty)))
    with pytest.raises(ValueError, match=f'checkpoint {empty} is empty'):
        model.init_weights()
    with pytest.raises(ValueError, match=f'checkpoint {empty} is empty'):
        load_checkpoint(torch.nn.Linear(2, 2), str(empty))


# -- official releases -----------------------------------------------------------------------

def official_dino(tmp_path, args):
    state = {'module.backbone.cls_token': torch.randn(1, 1, 4),
             'module.head.last_layer.weight_g': torch.ones(8, 1)}
    path = str(tmp_path / 'official.pth')
    torch.save({'student': state, 'teacher': dict(state), 'epoch': 100,
                'optimizer': {'state': {}, 'param_groups': [{'lr': 0.1}]},
                'args': args}, path)
    return path, state


def test_official_dino_args_become_a_plain_dict(tmp_path):
    args = argparse.Namespace(arch='vim_base', lr=5e-4, epochs=100, out_dim=65536,
                              global_crops_scale=(0.4, 1.0), data_path='/data/train')
    path, state = official_dino(tmp_path, args)
    loaded = load_official_checkpoint(path)
    assert type(loaded['args']) is InertRecord
    assert loaded['args'] == vars(args) and loaded['args'].arch == 'vim_base'
    assert loaded['epoch'] == 100
    for key, value in state.items():
        assert torch.equal(loaded['teacher'][key], value)
    # the same file is refused by the loader of our own checkpoints, with the fix
    with pytest.raises(UnsafeCheckpointError,
                       match='argparse.Namespace.*convert it first:\n    python '
                       'tools/model_converters/dinomamba2mmdinomamba.py'):
        load_checkpoint_file(path)


def test_official_yacs_config_becomes_an_ordered_dict(tmp_path, monkeypatch):
    path = str(tmp_path / 'mlla.pth')
    attack.save_with_cfg_node(path, lambda CfgNode: {
        'model': {'w': torch.ones(2)}, 'epoch': 299, 'max_accuracy': 83.4,
        'config': CfgNode({'MODEL': CfgNode({'TYPE': 'mlla', 'DROP_PATH_RATE': 0.2}),
                           'TRAIN': CfgNode({'EPOCHS': 300})})},
        str(tmp_path / 'ran'), monkeypatch)
    loaded = load_official_checkpoint(path)
    assert type(loaded['config']) is OrderedDict
    assert type(loaded['config']['MODEL']) is OrderedDict
    assert loaded['config']['MODEL'] == {'TYPE': 'mlla', 'DROP_PATH_RATE': 0.2}
    assert loaded['config']['TRAIN']['EPOCHS'] == 300
    assert loaded['max_accuracy'] == 83.4 and torch.equal(loaded['model']['w'],
                                                          torch.ones(2))
    assert not osp.exists(tmp_path / 'ran')


@pytest.mark.parametrize('name', ATTACKS)
def test_official_reader_refuses_other_globals_naming_file_and_global(
        name, attack_files):
    path, marker = attack_files[name]
    global_ = {'gadget': 'builtins.getattr', 'classic': 'posix.system'}[name]
    if name == 'gadget':  # getattr is allow-listed (restricted): refused on use
        match = f"refusing to load {path}: getattr"
    else:
        match = f'refusing to load {path}: it holds .*{global_}'
    with pytest.raises(UnsafeCheckpointError, match=match):
        load_official_checkpoint(path)
    assert not osp.exists(marker)


def test_official_reader_lists_every_foreign_global(tmp_path):
    path = str(tmp_path / 'foreign.pth')
    torch.save({'a': types.SimpleNamespace(x=1), 'b': attack.classic('x'),
                'c': argparse.ArgumentParser}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_official_checkpoint(path)
    message = str(info.value)
    assert path in message and 'posix.system' in message
    assert 'argparse.ArgumentParser' in message and 'types.SimpleNamespace' in message


def test_converter_reads_an_official_dino_checkpoint_with_its_args(tmp_path, load_tool,
                                                                    capsys):
    tool = load_tool('tools/model_converters/dinomamba2mmdinomamba.py')
    backbone = dinovim(16, 2, img_size=32, mixer_cfg=dict(d_state=4, headdim=8)).state_dict()
    state = {f'module.backbone.{k}': v for k, v in backbone.items()}
    src, dst = str(tmp_path / 'official.pth'), str(tmp_path / 'out.pth')
    torch.save({'teacher': state, 'student': state, 'epoch': 3,
                'args': argparse.Namespace(arch='vim_tiny')}, src)
    tool.main([src, dst])
    out = torch.load(dst)
    assert sorted(out) == sorted(backbone)
    assert all(torch.equal(out[k], v) for k, v in backbone.items())
