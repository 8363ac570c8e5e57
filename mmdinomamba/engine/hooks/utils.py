"""Helpers shared by the DINO hooks."""
import torch.nn as nn
from mmengine.model import is_model_wrapper


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside a DDP/FSDP-style wrapper, or ``model`` itself."""
    return model.module if is_model_wrapper(model) else model


def find_attr(model: nn.Module, attr: str, hook: str):
    """Return ``model.<attr>`` (dotted), with an error naming the hook if absent."""
    obj = model
    for part in attr.split('.'):
        if not hasattr(obj, part):
            raise AttributeError(f'{hook}: the model ({type(model).__name__}) has no '
                                 f'`{attr}`; use it with mmdinomamba\'s DINO')
        obj = getattr(obj, part)
    return obj
