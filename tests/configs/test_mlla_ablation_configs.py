"""configs/mlla/ablation/: every row of the paper's Tables 1 and 2 is a leaf of two
``_base_`` lines (its model on the linear-attention Swin-T, and the recipe); each
builds, runs a forward and backward pass on a tiny input, and has the parameter
count of the paper's column (1000 classes, 224 px) within 5 %."""
import ast
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ABLATION = osp.join(ROOT, 'configs', 'mlla', 'ablation')

# The paper's #params column (Han et al., NeurIPS 2024, Tables 1 and 2), in M.
PAPER_PARAMS = {
    'linear-swin-t_in1k': 28, 'linear-swin-t_+input-gate_in1k': 29,
    'linear-swin-t_+forget-gate_in1k': 29, 'linear-swin-t_+shortcut_in1k': 28,
    'linear-swin-t_-normalization_in1k': 28, 'linear-swin-t_-multi-head_in1k': 24,
    'linear-swin-t_+block-all_in1k': 28, 'linear-swin-t_+block-sub_in1k': 31,
    'linear-swin-t_+ape_in1k': 30, 'linear-swin-t_+lepe_in1k': 28,
    'linear-swin-t_+cpe_in1k': 28, 'linear-swin-t_+rope_in1k': 28,
}
def leaf(name):
    return osp.join(ABLATION, name + '.py')


def rows():
    return list(PAPER_PARAMS)


def build(name, **options):
    from mmpretrain.registry import MODELS

    import mmdinomamba  # noqa: F401
    cfg = Config.fromfile(leaf(name))
    cfg.merge_from_dict(options)
    return cfg, MODELS.build(cfg.model)


def test_every_row_is_a_leaf_of_two_bases():
    leaves = sorted(osp.splitext(osp.basename(p))[0]
                    for p in glob.glob(osp.join(ABLATION, '*.py')))
    assert leaves == sorted(PAPER_PARAMS)
    models = set()
    for name in leaves:
        tree = ast.parse(open(leaf(name)).read())
        [assign] = tree.body  # nothing but `_base_ = [model, recipe]`
        assert assign.targets[0].id == '_base_'
        model, recipe = ast.literal_eval(assign.value)
        assert recipe == '../_base_/mlla-recipe_32xb128-300e_in1k.py'
        assert model.startswith('./_base_/models/linear-swin-t')
        models.add(model)
    assert len(models) == len(leaves)


@pytest.mark.parametrize('name', rows())
def test_parameter_count_is_the_papers(name):
    _, model = build(name)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / (PAPER_PARAMS[name] * 1e6) - 1) <= 0.05, count


def test_the_baseline_is_swin_t_with_global_linear_attention():
    cfg, model = build('linear-swin-t_in1k')
    backbone = model.backbone
    assert cfg.model.head.in_channels == 768 and cfg.model.head.num_classes == 1000
    assert backbone.dims == [96, 192, 384, 768] and backbone.depths == [2, 2, 6, 2]
    block = backbone.layers[2].blocks[0]
    assert block.design == 'transformer' and block.cpe1 is None
    assert (block.attn.num_heads, block.attn.head_dim) == (12, 32)
    assert block.attn.v is not None and not block.attn.rope and block.attn.lepe is None
    assert type(backbone.patch_embed).__name__ == 'PatchStem'
    assert type(backbone.layers[0].downsample).__name__ == 'SwinPatchMerging'
    # Swin-T (28,288,354) less its relative position tables (169 x heads per block)
    swin_t = 28_288_354 - 169 * (3 * 2 + 6 * 2 + 12 * 6 + 24 * 2)
    assert sum(p.numel() for p in model.parameters()) == swin_t


def _switches(model):
    """What the row changes: block design, CPE, APE and every mixer's switches."""
    block = model.backbone.layers[0].blocks[0]
    return (block.design, block.cpe1 is not None, block.absolute_pos_embed is not None,
            block.attn.extra_repr())


@pytest.mark.slow
def test_rows_differ_from_the_baseline_in_their_design_only():
    base = _switches(build('linear-swin-t_in1k')[1])
    for name in PAPER_PARAMS:
        if name != 'linear-swin-t_in1k':
            assert _switches(build(name)[1]) != base, name


@pytest.mark.parametrize('name', list(PAPER_PARAMS))
def test_row_trains_a_step_on_a_tiny_input(name):
    """The model as configured (full width and depth, 1000 classes) on two 32 px
    images through the classifier's loss (label smoothing, Mixup / CutMix)."""
    from mmpretrain.structures import DataSample
    torch.manual_seed(0)
    _, model = build(name)
    model.train()
    samples = [DataSample().set_gt_label(torch.tensor([i])) for i in (3, 7)]
    losses = model(torch.randn(2, 3, 32, 32), samples, mode='loss')
    loss = sum(losses.values())
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
