"""Every shipped config that trains writes its checkpoints through
ResumableCheckpointHook (atomic, RNG-saving, finite-checked) and stops on
non-finite values (NonFiniteStopHook).

The hooks are set in the ``_base_`` runtime fragments (ours, and the dense ones
over mmseg's and mmdet's runtimes); a leaf that names mmengine's
``CheckpointHook`` again, or a fragment that drops the hook, fails here.
"""
import pytest

from tests.helpers.configs import leaf_configs, leaf_id, load


def trains(cfg) -> bool:
    """A config ``tools/train.py`` can run: a training loop and its data."""
    return bool(cfg.get('train_cfg') and cfg.get('train_dataloader'))


def hook_types(cfg):
    hooks = [h.get('type') for h in (cfg.get('default_hooks') or {}).values() if h]
    return hooks + [h.get('type') for h in cfg.get('custom_hooks') or []]


@pytest.mark.parametrize('path', leaf_configs(), ids=leaf_id)
def test_training_config_checkpoints_through_the_resumable_hook(path):
    cfg = load(path)
    if not trains(cfg):
        assert not cfg.get('train_cfg'), f'{path}: train_cfg without train_dataloader'
        return
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint')
    assert checkpoint is not None, f'{path}: no default_hooks.checkpoint'
    assert checkpoint.type == 'ResumableCheckpointHook', \
        f'{path}: default_hooks.checkpoint is {checkpoint.type}'
    assert checkpoint.get('interval', -1) > 0  # an interval set (or inherited)
    assert 'NonFiniteStopHook' in hook_types(cfg), path
    # the one type that saves: no second checkpoint hook among the custom ones
    assert not {'CheckpointHook', 'ResumableCheckpointHook'} & {
        h.get('type') for h in cfg.get('custom_hooks') or []}, path


def test_the_walk_covers_every_family():
    """The walk above sees the families that train (so that a change in how
    configs are found cannot make it vacuous)."""
    training = [leaf_id(p) for p in leaf_configs() if trains(load(p))]
    families = {name.split('/')[0] for name in training}
    assert {'dino', 'linear_probe', 'compare', 'mlla', 'upernet', 'cascade_mask_rcnn',
            'mask_rcnn'} <= families, families
    assert len(training) >= 60
