"""torch.compile for named submodules of a model, selected in the config."""
from typing import List, Sequence

import torch
import torch.nn as nn
from mmengine.hooks import Hook

from .utils import unwrap_model


class CompileModulesHook(Hook):
    """``torch.compile`` the named submodules of the model before training starts.

    mmengine's ``compile=dict(...)`` compiles the whole ``train_step``, where the
    optimizer step, the loss scaler and the teacher EMA break the graph; this hook
    compiles what is worth compiling, the backbones, in place
    (``nn.Module.compile``: the module, its state-dict keys and its checkpoints stay
    as they are). For DINO, the student's and the teacher's backbones::

        custom_hooks = [..., dict(type='CompileModulesHook',
                                  modules=['backbone', 'teacher.backbone'],
                                  mode='reduce-overhead', dynamic=False)]

    With DinoVim on CUDA the fused mixer runs as custom ops inside the graph
    (:mod:`mmdinomamba.ops.triton.mixer`); ``mode='reduce-overhead'`` replays each
    step's launches from CUDA graphs. ``dynamic=False`` gives each input shape (the
    global and the local crops) its own graph instead of one with symbolic sizes.
    The first iterations compile (about 80 s for DinoVim-T or -S on an H200).

    Args:
        modules (Sequence[str]): dotted names of submodules of the (unwrapped)
            model. Defaults to ``('backbone', )``.
        **compile_kwargs: arguments of ``torch.compile`` (``mode``, ``dynamic``,
            ``fullgraph``, ``backend``, ``options``).
    """
    priority = 'VERY_HIGH'

    def __init__(self, modules: Sequence[str] = ('backbone', ), **compile_kwargs):
        if isinstance(modules, str):
            modules = [modules]
        if not modules:
            raise ValueError('CompileModulesHook: `modules` names no submodule')
        self.modules = list(modules)
        self.compile_kwargs = compile_kwargs

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        for name, module in zip(self.modules, compile_submodules(
                model, self.modules, **self.compile_kwargs)):
            runner.logger.info(f'CompileModulesHook: compiled `{name}` '
                               f'({type(module).__name__}) with {self.compile_kwargs}')


def compile_submodules(model: nn.Module, names: Sequence[str],
                       **compile_kwargs) -> List[nn.Module]:
    """``torch.compile`` the submodules of ``model`` named (dotted) in ``names``, in
    place (``nn.Module.compile``: their names, their parameters' names and whoever
    holds them are unchanged). Every name is looked up before anything compiles;
    a missing one is an error naming it. Returns the modules, in ``names``' order."""
    if not hasattr(torch, 'compile'):
        raise RuntimeError('CompileModulesHook: torch.compile needs PyTorch >= 2.0, '
                           f'this is {torch.__version__}')
    modules = []
    for name in names:
        try:
            modules.append(model.get_submodule(name))
        except AttributeError:
            children = ', '.join(n for n, _ in model.named_children())
            raise AttributeError(
                f'CompileModulesHook: the model ({type(model).__name__}) has no '
                f'submodule {name!r}; its top-level modules are: {children}') from None
    for module in modules:
        module.compile(**compile_kwargs)
    return modules
