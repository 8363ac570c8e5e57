"""The README's quick start runs as written, and every path it names exists.

The Python blocks of the "Quick start" section are executed: the first builds a
backbone and draws its activation maps (DinoVim-T on two 224 px images, a few
seconds on a CPU), the second is the config delta that drops DinoVim into an
mmseg / mmdet config; the test builds that delta's backbone and neck and checks
that the neck receives what it expects. The shell block names tools and configs;
each must exist, and the checkpoint the Binary-AUC command reads must be the one
the training command writes.
"""
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
README = osp.join(REPO, 'README.md')


def _readme() -> str:
    with open(README, encoding='utf-8') as f:
        return f.read()


def _section(text: str, title: str) -> str:
    """The text under ``## title`` up to the next ``## `` heading."""
    match = re.search(rf'^## {re.escape(title)}\n(.*?)(?=^## )', text, re.M | re.S)
    if match is None:
        raise ValueError(f'README.md has no "## {title}" section')
    return match.group(1)


def _blocks(text: str, lang: str) -> list:
    return re.findall(rf'^```{lang}\n(.*?)^```', text, re.M | re.S)


def test_readme_is_short_and_has_no_dated_narrative():
    text = _readme()
    assert len(text.splitlines()) <= 200
    assert not re.search(r'\bround\b|stop [0-9]|tonight|\(night\)', text)


def test_readme_keeps_the_two_commands_ci_runs():
    """.ci/run runs ``make test``; the README promises ``make demo`` and ``make test``."""
    two = _blocks(_section(_readme(), 'Two commands'), 'bash')
    commands = [line.split('#')[0].strip() for line in two[0].splitlines()]
    assert commands == ['make demo', 'make test']
    with open(osp.join(REPO, '.ci', 'run'), encoding='utf-8') as f:
        assert 'make test' in f.read()


def test_quick_start_python_runs():
    build = _blocks(_section(_readme(), 'Quick start'), 'python')[0]
    namespace = {}
    exec(compile(build, 'README.md quick start', 'exec'), namespace)  # noqa: S102
    feats, maps, images = namespace['feats'], namespace['maps'], namespace['images']
    batch = images.shape[0]
    assert isinstance(feats, tuple)
    assert feats[-1].shape == (batch, 256)  # DinoVim-T is 256 wide
    assert maps.mean.shape == (batch, ) + tuple(images.shape[-2:])
    assert torch.isfinite(maps.mean).all()


def test_quick_start_config_delta_builds_a_dense_backbone():
    from mmseg.registry import MODELS
    import mmdinomamba  # noqa: F401  (registers DinoVim in mmseg)

    delta = _blocks(_section(_readme(), 'Quick start'), 'python')[1]
    namespace = {}
    exec(compile(delta, 'README.md config delta', 'exec'), namespace)  # noqa: S102
    assert namespace['custom_imports']['imports'] == ['mmdinomamba']
    backbone_cfg = dict(namespace['model']['backbone'])
    assert backbone_cfg.pop('_delete_') is True
    backbone_cfg['img_size'] = 64  # the same layout on a smaller grid, for speed
    # in mmseg's scope whatever scope an earlier test left current
    with MODELS.switch_scope_and_registry('mmseg') as models:
        backbone = models.build(backbone_cfg).eval()
        neck = models.build(namespace['model']['neck'])
    with torch.no_grad():
        maps = backbone(torch.rand(1, 3, 64, 64))
        pyramid = neck(maps)
    assert [tuple(m.shape) for m in maps] == [(1, 256, 4, 4)] * 4
    assert [tuple(p.shape[-2:]) for p in pyramid] == [(16, 16), (8, 8), (4, 4), (2, 2)]


def test_quick_start_commands_name_existing_files():
    shell = '\n'.join(_blocks(_section(_readme(), 'Quick start'), 'bash'))
    scripts = re.findall(r'python (tools/\S+\.py)', shell)
    configs = re.findall(r'configs/\S+\.py', shell)
    assert scripts and configs
    for path in scripts + configs:
        assert osp.isfile(osp.join(REPO, path)), path
    # the Binary-AUC command reads the checkpoint the training command writes
    train_cfg = 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py'
    assert train_cfg in configs
    cfg = Config.fromfile(osp.join(REPO, train_cfg))
    stem = osp.splitext(osp.basename(train_cfg))[0]
    assert f'work_dirs/{stem}/epoch_{cfg.train_cfg.max_epochs}.pth' in shell


def test_quick_start_data_step_makes_the_data_the_config_reads(load_tool):
    """The data command writes the rich 64 px toy data where the training and the
    Binary-AUC configs read it (the simple style at 96 px left DINO at log K)."""
    import shlex
    shell = '\n'.join(_blocks(_section(_readme(), 'Quick start'), 'bash'))
    commands = shell.replace('\\\n', ' ').splitlines()  # continued lines joined
    line = next(line for line in commands if 'tools/make_toy_data.py' in line)
    argv = shlex.split(line.split('#')[0])
    assert argv[:2] == ['python', 'tools/make_toy_data.py']
    args = load_tool('tools/make_toy_data.py').build_parser().parse_args(argv[2:])
    train = Config.fromfile(
        osp.join(REPO, 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py'))
    auc = Config.fromfile(
        osp.join(REPO, 'configs/binary_auc/binary-auc_dinovim-toy-p8_toy.py'))
    assert args.out_dir == train.train_dataloader.dataset.data_root == \
        auc.test_dataloader.dataset.data_root
    crop = next(t for t in train.train_dataloader.dataset.pipeline
                if t['type'] == 'DINOMultiCrop')
    assert args.style == 'rich' and args.size == crop['global_size']
    assert args.formats is None or 'imagenet' in args.formats  # ImageNet-S masks
    assert args.overwrite  # a second run, or one after make demo, replaces it
    # make demo's data (the README's expected losses are the demo's DINO run)
    from mmdinomamba.studies.comparison.presets import PRESETS
    demo = PRESETS['demo'].data
    assert (args.train_per_class, args.val_per_class) == \
        (demo['train_per_class'], demo['val_per_class'])
    assert (args.style, args.size) == (demo['style'], demo['size'])


def test_every_config_path_in_readme_exists():
    text = _readme()
    named = set(re.findall(r'configs/[\w./-]+', text))
    assert named
    for path in named:
        path = path.rstrip('.')
        assert osp.exists(osp.join(REPO, path)), f'README.md names {path}, which is missing'


@pytest.mark.parametrize('path', ['LICENSE', 'CHANGELOG.md'])
def test_license_and_changelog_exist(path):
    with open(osp.join(REPO, path), encoding='utf-8') as f:
        text = f.read()
    if path == 'LICENSE':
        assert 'Apache License' in text and 'Version 2.0' in text
        assert 'END OF TERMS AND CONDITIONS' in text  # the full text, not a pointer
    else:
        assert re.search(r'^## 0\.1\.0', text, re.M)
