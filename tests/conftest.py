"""Shared test fixtures, and the ``gpu`` marker's skip.

Test isolation for mmengine's process-wide state: building from an mmseg/mmdet
config makes that package the current ``DefaultScope`` for the rest of the
process, so a later test that builds from mmpretrain's registry would silently
resolve names (``DINO``!) in mmdet's. Each test starts from the scopes that
existed before it.

``pytest_configure`` memoises two of mmengine's lookups for the session: it resolves
every ``mmpretrain::``/``mmseg::``/``mmdet::`` base by first parsing all of that
package's metafiles (about 100 YAML files, 0.3 s a base) and asking pkg_resources
whether the package is installed. Neither changes while the tests run, and the
answer is the same; the tools the ``slow`` tests start look them up unmemoised.

Under pytest-xdist (``make test-fast``) each worker takes its share of the cores
for torch's intra-op threads, so two workers on two cores do not run four threads.

``load_tool``: the scripts under ``tools/`` are not a package; tests import them
by path.

``toy_data``: the toy datasets the tests read, each made once per session;
``toy_root``: the one of the DINO training tests. The tiny models: tests/factories.py.

The tiers (pytest.ini): a test that starts a Python process or a worker process,
or trains through mmengine's ``Runner.train``, is marked ``slow`` (``make
test-fast`` leaves it out); ``_slow_work_is_marked`` fails one that is not.
"""
import functools
import importlib.util
import json
import multiprocessing.process
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.registry import DefaultScope

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


@pytest.fixture(scope='session')
def load_tool():
    """``load_tool('tools/train.py')``: the script imported as a module."""
    def load(relpath: str):
        name = '_tool_' + relpath[:-len('.py')].replace('/', '_')
        spec = importlib.util.spec_from_file_location(name, osp.join(REPO, relpath))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


def pytest_configure(config):
    _share_the_cores()
    _memoise_upstream_config_lookups()


def _share_the_cores():
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
    if workers > 1:
        import torch
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def _memoise_upstream_config_lookups():
    from mmengine.config import config as config_module
    from mmengine.config import utils as config_utils
    lookup = config_utils._get_cfg_metainfo

    @functools.lru_cache(maxsize=None)
    def looked_up(package_path, cfg_path):
        try:
            return lookup(package_path, cfg_path), None
        except ValueError as error:  # a ``_base_`` file: mmengine falls back on it
            return None, error.args

    def metainfo(package_path, cfg_path):
        found, error = looked_up(package_path, cfg_path)
        if error is not None:
            raise ValueError(*error)
        return found

    config_utils._get_cfg_metainfo = metainfo
    config_module.is_installed = functools.lru_cache(maxsize=None)(
        config_module.is_installed)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device and Triton: skipped without them."""
    import torch

    from mmdinomamba.ops import triton_available
    if torch.cuda.is_available() and triton_available():
        return
    skip = pytest.mark.skip(reason='needs a CUDA device and Triton (marked gpu)')
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope='session')
def toy_data(tmp_path_factory):
    """``toy_data(**kwargs)``: the toy dataset that
    :func:`mmdinomamba.datasets.make_toy_dataset` makes with ``kwargs``, made once
    per session and shared by the tests that ask for the same one: read it, do
    not change it (copy it first)."""
    from mmdinomamba.datasets import make_toy_dataset
    made = {}

    def make(**kwargs):
        key = json.dumps(kwargs, sort_keys=True, default=list)
        if key not in made:
            made[key] = make_toy_dataset(str(tmp_path_factory.mktemp('toy') / 'data'),
                                         **kwargs)
        return made[key]

    return make


@pytest.fixture(scope='module')
def toy_root(toy_data):
    """The DINO training tests' data: 16 training images (4 iterations of 4 images
    an epoch), 2 held-out, 48 px."""
    return toy_data(num_classes=2, train_per_class=8, val_per_class=1, size=48,
                    formats=['imagenet'])


@pytest.fixture(autouse=True)
def _restore_default_scope():
    saved = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)


def _python_or_shell(args) -> bool:
    """Whether a ``Popen`` argv starts a Python interpreter or a shell script."""
    program = args if isinstance(args, str) else (list(args) or [''])[0]
    name = osp.basename(str(program).split()[0]) if str(program).strip() else ''
    return (str(program) == sys.executable or name.startswith('python')
            or name in ('bash', 'sh', 'torchrun'))


@pytest.fixture(autouse=True)
def _slow_work_is_marked(request, monkeypatch):
    """In a test not marked ``slow``: starting Python (a tool, a worker), a
    multiprocessing worker, or ``Runner.train`` fails, naming the marker."""
    if request.node.get_closest_marker('slow') is not None:
        return
    from mmengine.runner import Runner
    message = (f'{request.node.nodeid} {{}}: mark it @pytest.mark.slow '
               '(make test-fast leaves those out)')
    popen = subprocess.Popen

    class CheckedPopen(popen):
        def __init__(self, args, *rest, **kwargs):
            if _python_or_shell(args):
                raise RuntimeError(message.format(f'starts a process ({args!r})'))
            super().__init__(args, *rest, **kwargs)

    def start(self):
        raise RuntimeError(message.format('starts a worker process'))

    def train(self):
        raise RuntimeError(message.format('trains through Runner.train'))

    monkeypatch.setattr(subprocess, 'Popen', CheckedPopen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, 'start', start)
    monkeypatch.setattr(Runner, 'train', train)
