"""The rank-analysis pipeline: configs, checkpoints, images, measures, outputs."""
import csv
import json
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from mmdinomamba.analysis.images import (DEFAULT_PREPROCESSOR, ImagePipeline,
                                         folder_images, toy_images)
from mmdinomamba.analysis.loading import backbone_config, load_backbone
from mmdinomamba.analysis.mixing import MixerInfo
from mmdinomamba.analysis.mixing_rank import (SUMMARY_COLUMNS, analyse_backbone,
                                              offdiag_bounds)
from mmdinomamba.analysis.rank_report import format_table, write_report
from mmdinomamba.models import DinoVim
from mmdinomamba.models.checkpoint import load_backbone_checkpoint
from tests.factories import dinovim, linear_vit
from tests.helpers.reference_data import VIM, reference_path

IMAGENET_MEAN, IMAGENET_STD = DEFAULT_PREPROCESSOR['mean'], DEFAULT_PREPROCESSOR['std']

REPO = osp.join(osp.dirname(__file__), '..', '..')


def tiny_dinovim(**kw):
    return dinovim(32, 2, img_size=48, drop_path_rate=0.0,
                   mixer_cfg=dict(d_state=4, headdim=16), **kw)


def tiny_linear_vit():
    return linear_vit(32, 2, num_heads=4, img_size=48, drop_path_rate=0.0)


def test_backbone_config_both_forms():
    plain = dict(type='DinoVim', arch='tiny')
    assert backbone_config(Config(dict(model=plain))) == plain
    wrapped = Config(dict(model=dict(type='ImageClassifier', backbone=plain,
                                     head=dict(type='LinearClsHead'))))
    assert backbone_config(wrapped) == plain
    with pytest.raises(ValueError, match='no `model`'):
        backbone_config(Config(dict(data=1)))
    with pytest.raises(ValueError, match='with a `type`'):
        backbone_config(Config(dict(model=dict(backbone=dict(arch='tiny')))))


def test_build_backbone_from_config():
    backbone = load_backbone(dict(type='DinoVim', arch=dict(embed_dims=32,
                                                            num_layers=2)))
    assert isinstance(backbone, DinoVim) and len(backbone.layers) == 2


def test_checkpoint_round_trip_with_prefix(tmp_path):
    source = tiny_dinovim()
    path = str(tmp_path / 'epoch_1.pth')
    torch.save(dict(meta=dict(epoch=1), state_dict={
        **{f'backbone.{k}': v for k, v in source.state_dict().items()},
        'head.fc.weight': torch.zeros(2, 2)}), path)
    torch.manual_seed(1)
    target = DinoVim(arch=dict(embed_dims=32, num_layers=2), img_size=48,
                     mixer_cfg=dict(d_state=4, headdim=16))
    assert load_backbone_checkpoint(target, path) == 'backbone.'
    for k, v in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[k], v, rtol=0, atol=0)
    # an explicit wrong prefix leaves keys missing: that must fail loudly
    with pytest.raises(ValueError, match='missing'):
        load_backbone_checkpoint(target, path, prefix='head.')
    with pytest.raises(FileNotFoundError):
        load_backbone_checkpoint(target, str(tmp_path / 'absent.pth'))
    torch.save({'x.y': torch.zeros(1)}, str(tmp_path / 'other.pth'))
    with pytest.raises(ValueError, match='matches the backbone'):
        load_backbone_checkpoint(target, str(tmp_path / 'other.pth'))


def test_official_fixture_loads_through_the_config():
    cfg = Config.fromfile(
        osp.join(REPO, 'configs', 'analysis', 'dinovim-d256-depth4_p16_224px.py'))
    backbone = load_backbone(cfg)
    path = reference_path(VIM)
    assert load_backbone_checkpoint(backbone, path) == ''
    state = torch.load(path)['state_dict']
    torch.testing.assert_close(backbone.layers[3].mixer.A_log_b,
                               state['layers.3.mixer.A_log_b'], rtol=0, atol=0)


def pipeline(size):
    """The default pipeline and preprocessor (a config with only a model)."""
    return ImagePipeline(Config(dict(model=dict(type='DinoVim'))), size)


def test_preprocess_and_image_sources(tmp_path):
    # a 40 x 60 image: resized to 32 x 48, centre column block kept
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    pipe = pipeline(32)
    out = pipe.from_arrays([image])[0]
    assert out.shape == (3, 32, 32)
    flat = np.full((40, 60, 3), 200, np.uint8)
    expected = (200 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    torch.testing.assert_close(pipe.from_arrays([flat])[0][:, 5, 7].double(),
                               torch.from_numpy(expected), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match='uint8 RGB'):
        pipe.from_arrays([image[..., 0]])
    (tmp_path / 'a' / 'b').mkdir(parents=True)
    for i, sub in enumerate(('a', 'a/b', '.')):
        Image.fromarray(image).save(str(tmp_path / sub / f'img{i}.png'))
    (tmp_path / 'notes.txt').write_text('not an image')
    images = folder_images(pipe, str(tmp_path), 5)
    assert images.shape == (3, 3, 32, 32)
    torch.testing.assert_close(images[0], out)
    (tmp_path / 'empty').mkdir()
    with pytest.raises(ValueError, match='no images'):
        folder_images(pipe, str(tmp_path / 'empty'), 1)
    with pytest.raises(FileNotFoundError):
        folder_images(pipe, str(tmp_path / 'missing'), 1)
    toy = toy_images(pipe, 3, 32, seed=0)
    assert toy.shape == (3, 3, 32, 32) and torch.isfinite(toy).all()
    torch.testing.assert_close(toy, toy_images(pipe, 3, 32, seed=0))
    assert not torch.equal(toy, toy_images(pipe, 3, 32, seed=1))


def test_offdiag_bounds_per_kind():
    no_stencil = dict(near_offdiag_bound=None, far_offdiag_bound=None)
    softmax = offdiag_bounds(MixerInfo('softmax', 4, 16, ('attention', )), 32, 66)
    assert softmax == dict(global_bound=66, offdiag_bound_paper=32,
                           offdiag_bound_algebra=32, **no_stencil)
    linear = offdiag_bounds(MixerInfo('linear', 4, 16, ('attention', )), 8, 66)
    assert linear == dict(global_bound=16, offdiag_bound_paper=16,
                          offdiag_bound_algebra=8, **no_stencil)
    ssd = offdiag_bounds(MixerInfo('ssd', 8, 16, ('forward', )), 32, 66, mask_rank=66)
    assert ssd == dict(global_bound=66, offdiag_bound_paper=66 * 16,
                       offdiag_bound_algebra=16, **no_stencil)
    with pytest.raises(ValueError, match='mask_rank'):
        offdiag_bounds(MixerInfo('ssd', 8, 16, ('forward', )), 32, 66)


@pytest.fixture(scope='module')
def reports():
    images = toy_images(pipeline(48), 2, 48, seed=0)
    return {name: analyse_backbone(build(), images, chunk=8, progress=False)
            for name, build in (('ssd', tiny_dinovim), ('linear', tiny_linear_vit))}


def test_analyse_backbone_ssd(reports):
    report = reports['ssd']
    seqlen = 9 + 2  # 3 x 3 patches + [CLS] twice
    assert report.meta['seqlen'] == seqlen and report.meta['layers'] == [0, 1]
    # images x layers x keys x heads (inner 64 / headdim 16 = 4 heads)
    assert len(report.records) == 2 * 2 * 3 * 4
    assert [(s['layer'], s['key']) for s in report.summary] == [
        (layer, key) for layer in (0, 1) for key in ('forward', 'backward', 'combined')]
    for s in report.summary:
        assert s['within_bounds']
        assert s['offdiag_rank_max'] <= 4 == s['offdiag_bound_algebra']
        assert s['mask_offdiag_rank_max'] <= 1
        assert s['mask_rank_max'] == seqlen
        assert s['offdiag_bound_paper'] == seqlen * 4 > s['offdiag_bound_algebra']
        assert s['rank_max'] <= seqlen
    forward = [r for r in report.records if r['key'] == 'forward']
    assert all(r['upper_offdiag_rank_max'] == 0 for r in forward)  # causal
    assert len(report.spectra['0/forward']) == seqlen
    assert report.spectra['0/forward'][0] == pytest.approx(1.0)


def test_analyse_backbone_linear(reports):
    report = reports['linear']
    for s in report.summary:
        assert s['rank_max'] <= s['d_qk'] == 8 == s['global_bound']
        assert s['offdiag_rank_max'] <= 8
        assert s['within_bounds'] and s['mask_rank_max'] is None
    with pytest.raises(ValueError, match='chunk'):
        analyse_backbone(tiny_linear_vit(), toy_images(pipeline(48), 1, 48), chunk=0,
                         progress=False)
    with pytest.raises(ValueError, match='images must have shape'):
        analyse_backbone(tiny_linear_vit(), torch.zeros(3, 48, 48), progress=False)


def test_write_report(reports, tmp_path):
    report = reports['ssd']
    paths = write_report(report, str(tmp_path / 'out'), title='tiny')
    data = json.load(open(paths['json']))
    assert data['summary'] == json.loads(json.dumps(report.summary))
    with open(paths['summary_csv']) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(SUMMARY_COLUMNS) and len(rows) == 6
    assert int(rows[0]['offdiag_rank_max']) == report.summary[0]['offdiag_rank_max']
    with open(paths['heads_csv']) as f:
        assert len(list(csv.DictReader(f))) == len(report.records)
    table = open(paths['table']).read()
    assert table.strip() == format_table(report.summary)
    assert table.count('\n') == 2 + len(report.summary)
    for key in ('spectra_png', 'rank_png'):
        with Image.open(paths[key]) as image:
            assert image.format == 'PNG' and image.size[0] > 300
    # no temporary files left next to the results
    assert sorted(osp.basename(p) for p in paths.values()) == sorted(
        p.name for p in (tmp_path / 'out').iterdir())
