"""The dense configs (UperNet, Cascade and Mask R-CNN) and the classification
configs that ``tools/test.py`` runs (MLLA, the DinoVim linear probes and the
robustness tests over them) carry CUDAGraphBlocksHook, so that testing on a GPU
replays DinoVim's and MLLA's blocks from CUDA graphs (the hook's ``before_test``);
the toy configs (CPU) do not need it."""
import pytest

from mmdinomamba.engine.hooks import CUDAGraphBlocksHook
from tests.helpers.configs import leaf_configs, leaf_id, load

FAMILIES = ('upernet', 'cascade_mask_rcnn', 'mask_rcnn', 'linear_probe', 'robustness',
            'mlla')
GRAPHED = ('DinoVim', 'MLLA')  # backbones with a stack or stage runner


def configs_under_test():
    return [p for p in leaf_configs()
            if leaf_id(p).split('/')[0] in FAMILIES and '_toy' not in leaf_id(p)]


@pytest.mark.parametrize('path', configs_under_test(), ids=leaf_id)
def test_test_configs_of_graphable_backbones_carry_the_hook(path):
    cfg = load(path)
    assert cfg.get('test_dataloader'), path
    hooks = [h for h in cfg.get('custom_hooks') or [] if h.type == 'CUDAGraphBlocksHook']
    if cfg.model.backbone.type not in GRAPHED:
        return  # ViT, LinearViT: may inherit it from a shared recipe (one info line)
    assert len(hooks) == 1, (path, [h.type for h in cfg.get('custom_hooks') or []])
    args = {k: v for k, v in hooks[0].items() if k != 'type'}
    hook = CUDAGraphBlocksHook(**args)  # valid arguments
    assert hook.test, path


def test_the_walk_covers_each_family_and_both_backbones():
    seen = {(leaf_id(p).split('/')[0], load(p).model.backbone.type)
            for p in configs_under_test()}
    for family in ('upernet', 'cascade_mask_rcnn', 'linear_probe', 'robustness'):
        assert (family, 'DinoVim') in seen, family
    for family in ('upernet', 'mask_rcnn', 'mlla'):
        assert (family, 'MLLA') in seen, family
