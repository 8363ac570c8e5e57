"""mmengine's optimizer constructor with one parameter group per distinct setting.

With a ``paramwise_cfg`` (e.g. ``flat_decay_mult=0.0``: no weight decay on 1-D
tensors), mmengine's ``DefaultOptimWrapperConstructor`` puts every parameter tensor
in a group of its own. PyTorch's optimizers loop over groups in Python, so a step
of DINO with DinoVim-B (about 375 tensors, teacher excluded) makes that many
fused-AdamW launches and reads each group's options through mmengine's
``ConfigDict`` (the groups are converted on the way in): in a profile of the eager
DINO step on an H200 the optimizer step was about a seventh of the host's time.
This constructor builds the same groups and then merges those whose options are
equal, keeping the parameters' order, so the optimizer sees one group per setting
(two for DINO: decayed and not).

The update is unchanged, parameter for parameter: AdamW is elementwise, and every
tensor keeps its own options. Optimizer states in checkpoints written with the
per-tensor groups do not load into the merged ones (the group count differs).

In a config::

    optim_wrapper = dict(constructor='GroupedOptimWrapperConstructor',
                         optimizer=dict(type='AdamW', ...),
                         paramwise_cfg=dict(flat_decay_mult=0.0))
"""
from typing import Dict, List

from mmengine.optim import DefaultOptimWrapperConstructor


def merge_param_groups(groups: List[Dict]) -> List[Dict]:
    """Groups with equal options (every key but ``params``) merged into one, in the
    order each setting first appears; parameters keep their order.

    Args:
        groups (list[dict]): optimizer parameter groups, each with ``params``.

    Returns:
        list[dict]: one group per distinct setting (new dicts; input unchanged).
    """
    merged: List[Dict] = []
    for group in groups:
        options = {k: v for k, v in group.items() if k != 'params'}
        params = list(group['params'])
        for target in merged:
            if {k: v for k, v in target.items() if k != 'params'} == options:
                target['params'].extend(params)
                break
        else:
            merged.append(dict(options, params=params))
    return merged


class GroupedOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """:class:`~mmengine.optim.DefaultOptimWrapperConstructor` whose per-parameter
    groups are merged by :func:`merge_param_groups`. Same arguments.

    A module none of whose parameters trains (DINO's teacher, updated as an EMA of
    the student) is passed over as a whole: mmengine would leave out each of its
    tensors just the same, with one warning per tensor (78 for the toy DinoVim's
    teacher) that says nothing a user can act on."""

    def add_params(self, params: List[Dict], module, prefix: str = '',
                   is_dcn_module=None) -> None:
        if not any(p.requires_grad for p in module.parameters()):
            return  # frozen as a whole: nothing to optimise
        if prefix:  # mmengine's recursion into a child module
            return super().add_params(params, module, prefix, is_dcn_module)
        groups: List[Dict] = []
        super().add_params(groups, module, prefix, is_dcn_module)
        params.extend(merge_param_groups(groups))
