"""The model index: ``model-index.yml`` and one ``metafile.yml`` per config folder
in OpenMMLab's format, read with the ``modelindex`` package; registered with
mmpretrain's ModelHub on ``import mmdinomamba``, from a checkout and from a
regular (non-editable) install."""
import glob
import os
import os.path as osp
import shutil
import subprocess
import sys

import mmpretrain
import pytest
import torch
import yaml
from modelindex.load_model_index import load

import mmdinomamba  # noqa: F401  (registers the index)
from mmdinomamba import zoo

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# folders of evaluation or analysis configs: they evaluate the models of the other
# folders (robustness: the linear probes, whose records carry those results) or
# measure randomly initialised backbones (analysis); no model records of their own
NOT_MODELS = ('robustness', 'analysis')


def load_index():
    index = load(osp.join(REPO, 'model-index.yml'))
    index.build_models_with_collections()
    return index


MODELS = {model.name: model for model in load_index().models}
ENV = dict(os.environ, OMP_NUM_THREADS='1')


def test_names_unique_lower_case_and_every_metafile_imported():
    names = [model.name for model in load_index().models]
    assert len(names) == len(set(names)) == len(MODELS)
    assert all(name == name.lower() and ' ' not in name for name in names)
    with open(osp.join(REPO, 'model-index.yml')) as f:
        imported = yaml.safe_load(f)['Import']
    metafiles = sorted(osp.relpath(p, REPO)
                       for p in glob.glob(osp.join(REPO, 'configs', '*',
                                                   'metafile.yml')))
    assert sorted(imported) == metafiles


def test_every_leaf_config_of_a_model_folder_has_a_record():
    """Every config outside ``_base_`` folders (and outside :data:`NOT_MODELS`),
    subfolders included, is the config of one record."""
    leaves = set()
    for path in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True):
        parts = osp.relpath(path, REPO).split(os.sep)
        if '_base_' not in parts and parts[1] not in NOT_MODELS:
            leaves.add('/'.join(parts))
    assert {model.config for model in MODELS.values()} == leaves


def test_records_are_complete():
    collections = {c.name: c for c in load_index().collections}
    for name, model in MODELS.items():
        collection = collections[model.in_collection]
        assert collection.paper['URL'].startswith('https://arxiv.org/'), name
        assert osp.isfile(osp.join(REPO, model.config)), name
        for result in model.results or []:
            assert result.task and result.dataset and result.metrics, name
            assert all(0 < v <= 100 for v in result.metrics.values()), name
        source = model.data.get('Converted From')
        if source:  # official weights: where they are and the command converting them
            assert source['Weights'].startswith('https://'), name
            tool = source['Converter'].split()[1]
            assert osp.isfile(osp.join(REPO, tool)), name
        for downstream in model.data.get('Downstream', []):
            assert downstream in MODELS, (name, downstream)


def marked_lines(stdout: str) -> dict:
    """{MARK: words} of the lines a subprocess printed as ``MARK words...`` (the
    libraries print their own lines in between)."""
    return {line.split()[0]: line.split()[1:] for line in stdout.splitlines()
            if line.split() and line.split()[0].isupper()}


def build(name: str) -> torch.nn.Module:
    """``mmpretrain.get_model(name)``, on the meta device where the model allows it
    (no memory, no time); MLLA's initialisation reads values, so it builds on the
    CPU."""
    try:
        with torch.device('meta'):
            return mmpretrain.get_model(name)
    except (RuntimeError, NotImplementedError) as err:
        if 'meta' not in str(err):
            raise
    return mmpretrain.get_model(name)


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(MODELS))
def test_every_model_builds_through_mmpretrain_with_its_parameter_count(name):
    """``mmpretrain.get_model(name)`` builds every record from its config (the
    mmseg and mmdet ones in their own scope), with the recorded parameter count."""
    model = build(name)
    assert sum(p.numel() for p in model.parameters()) == \
        MODELS[name].metadata.data['Parameters']


TOY = sorted(name for name, model in MODELS.items()
             if 'toy' in name and 'FLOPs' in model.metadata.data)


@pytest.mark.parametrize('name', TOY)
def test_recorded_macs_are_the_counter_s(name):
    """The FLOPs of a record are the multiply-accumulates that
    ``tools/analysis/get_flops.py`` counts for one backbone at the config's input
    size (checked on the toy-sized models; the full-size ones were counted the same
    way)."""
    from mmengine.config import Config

    from mmdinomamba.analysis.flops import build_model_from_config, model_complexity
    cfg = Config.fromfile(osp.join(REPO, MODELS[name].config))
    model = build_model_from_config(cfg)
    size = cfg.model.backbone.get('img_size', 224)
    macs = model_complexity(model.backbone, (size, size)).macs
    assert macs == MODELS[name].metadata.data['FLOPs']


@pytest.mark.slow
def test_fresh_process_lists_and_builds_ours(tmp_path):
    """``import mmdinomamba, mmpretrain`` in a fresh process, from another folder:
    ``list_models('*dinovim*')`` lists our DinoVim models, ``get_model`` builds one
    and ``pretrained=`` takes a local file."""
    ckpt = tmp_path / 'weights.pth'
    code = f"""
import torch
import mmdinomamba, mmpretrain
print('LISTED', ' '.join(mmpretrain.list_models('*dinovim*')))
model = mmpretrain.get_model('dinovim-toy-p8_dino-pre_1xb16-linear-10e_toy')
state = {{k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()}}
torch.save(dict(state_dict=state), {str(ckpt)!r})
loaded = mmpretrain.get_model('dinovim-toy-p8_dino-pre_1xb16-linear-10e_toy',
                              pretrained={str(ckpt)!r})
assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
print('LOADED', len(state))
"""
    proc = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path), env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = marked_lines(proc.stdout)
    assert set(out['LISTED']) == {n for n in MODELS if 'dinovim' in n}
    assert int(out['LOADED'][0]) > 0


@pytest.mark.slow
def test_regular_install_ships_the_configs_and_the_index(tmp_path):
    """An sdist built from the checkout, a wheel built from the sdist, the wheel
    installed into a folder: its ``mmdinomamba/.mim`` holds the configs and the
    index, and a fresh process importing that copy lists and builds our models."""
    src = tmp_path / 'src'
    for name in ('mmdinomamba', 'configs'):
        shutil.copytree(osp.join(REPO, name), src / name,
                        ignore=shutil.ignore_patterns('__pycache__'))
    for name in ('setup.py', 'MANIFEST.in', 'README.md', 'model-index.yml'):
        shutil.copy(osp.join(REPO, name), src / name)
    run = dict(env=ENV, capture_output=True, text=True, timeout=300)
    proc = subprocess.run([sys.executable, 'setup.py', '-q', 'sdist', '-d',
                           str(tmp_path / 'dist')], cwd=str(src), **run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist, = glob.glob(str(tmp_path / 'dist' / '*.tar.gz'))
    proc = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
                           '--no-build-isolation', '-w', str(tmp_path / 'wheels'),
                           sdist],
                          cwd=str(tmp_path), **run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel, = glob.glob(str(tmp_path / 'wheels' / '*.whl'))
    site = tmp_path / 'site'
    proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps',
                           '--target', str(site), wheel], cwd=str(tmp_path), **run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mim = site / 'mmdinomamba' / '.mim'
    shipped = {osp.relpath(p, mim) for p in glob.glob(str(mim / 'configs' / '**' / '*'),
                                                      recursive=True)
               if '__pycache__' not in p}  # pip compiles what it installs
    ours = {osp.relpath(p, REPO) for p in glob.glob(osp.join(REPO, 'configs', '**', '*'),
                                                    recursive=True)
            if '__pycache__' not in p}
    assert shipped == ours and (mim / 'model-index.yml').is_file()
    code = """
import mmdinomamba, mmpretrain
from mmdinomamba import zoo
print('WHERE', mmdinomamba.__file__, zoo.package_root())
print('LISTED', ' '.join(mmpretrain.list_models('*mlla*')))
print('BUILT', type(mmpretrain.get_model('mlla-tiny_32xb128-300e_in1k')).__name__)
"""
    env = dict(ENV, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = marked_lines(proc.stdout)
    assert out['WHERE'] == [str(site / 'mmdinomamba' / '__init__.py'), str(mim)]
    assert out['LISTED'] == sorted(n for n in MODELS if 'mlla' in n)
    assert out['BUILT'] == ['ImageClassifier']


@pytest.mark.slow
def test_registration_happens_once():
    assert zoo.register_model_index() is False  # done on import
    from mmpretrain.apis import ModelHub
    for name in MODELS:
        assert ModelHub.has(name)
        assert ModelHub.get(name).config.filename == osp.join(REPO, MODELS[name].config)


def test_pretrained_true_without_weights_says_so_and_names_the_ways_to_weights():
    """No record hosts weights: ``pretrained=True`` (and an inferencer, whose default
    it is) raises instead of building a randomly initialised model; the message
    names the converter of the official release and ``pretrained=PATH``."""
    from mmpretrain import ImageClassificationInferencer
    for call in (lambda: mmpretrain.get_model('mlla-tiny_32xb128-300e_in1k',
                                              pretrained=True),
                 lambda: ImageClassificationInferencer('mlla-tiny_32xb128-300e_in1k')):
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert 'mlla-tiny_32xb128-300e_in1k has no weights to download' in message
        assert 'randomly initialised' in message and 'pretrained=PATH' in message
        assert ('python tools/model_converters/mlla2mmdinomamba.py mlla_t.pth '
                "checkpoints/mlla-tiny_3rdparty_in1k.pth`, then "
                "pretrained='checkpoints/mlla-tiny_3rdparty_in1k.pth'") in message
        assert MODELS['mlla-tiny_32xb128-300e_in1k'].data['Converted From'][
            'Weights'] in message
    # a record without an official release names the user's own checkpoint only
    with pytest.raises(ValueError, match=r"(?s)no weights to download.*"
                       r"your own checkpoint.*tools/train\.py") as err:
        mmpretrain.get_model('dino_dinovim-toy-p8_1xb8-10e_toy', pretrained=True)
    assert 'official release' not in str(err.value)


def test_a_local_checkpoint_still_loads_through_pretrained(tmp_path):
    model = mmpretrain.get_model('dinovim-toy-p8_dino-pre_1xb16-linear-10e_toy')
    ckpt = tmp_path / 'probe.pth'
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.save(dict(state_dict=model.state_dict()), str(ckpt))
    loaded = mmpretrain.get_model('dinovim-toy-p8_dino-pre_1xb16-linear-10e_toy',
                                  pretrained=str(ckpt))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, msg=key)


@pytest.mark.parametrize('alias,record', [
    ('mlla-tiny', 'mlla-tiny_32xb128-300e_in1k'), ('MLLA-T', 'mlla-tiny_32xb128-300e_in1k'),
    ('dinovim-tiny', 'dinovim-tiny-p16_dino-pre_4xb128-linear-coslr-100e_in1k'),
    ('dinovim-b-p16', 'dinovim-base-p16_dino-pre_4xb128-linear-coslr-100e_in1k'),
    ('reg-b', 'dinomamba-reg-base-p16_dino-pre_4xb128-linear-coslr-100e_in1k')])
def test_the_backbone_names_of_the_docs_resolve_in_get_model(alias, record):
    """docs/get_started.md's names (and aliases, any case) stand for the image
    classifier of that backbone; ``list_models`` still lists records only."""
    from mmpretrain.apis import ModelHub
    assert zoo.hub_name(alias) == record
    assert ModelHub.get(alias).name == record
    assert alias.lower() not in mmpretrain.list_models()
    with pytest.raises(ValueError, match=f'{record} has no weights to download'):
        mmpretrain.get_model(alias, pretrained=True)


def test_a_backbone_name_builds_its_classifier():
    model = build('mlla-t')
    assert type(model).__name__ == 'ImageClassifier'
    assert type(model.backbone).__name__ == 'MLLA'
    assert sum(p.numel() for p in model.parameters()) == \
        MODELS['mlla-tiny_32xb128-300e_in1k'].metadata.data['Parameters']
    with pytest.raises(ValueError, match='Failed to find model'):
        mmpretrain.get_model('dinovim-huge')
    assert zoo.hub_name('dinovim-tiny-p8') is None  # no p8 record of DinoVim-T
