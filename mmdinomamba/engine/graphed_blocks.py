"""A backbone's block stack replayed from CUDA graphs (torch only).

An eager DinoVim step issues a few dozen small launches per block from Python, 24
blocks deep; the host then takes longer to issue a training step than the GPU takes
to run it, and T, S and B train at one speed (``benchmarks/README.md``).
:class:`GraphedBlocks` captures the whole stack once per input signature (shape,
dtype, autocast state) and replays it: one launch for the forward and one for the
backward of all blocks. :class:`GraphedStack` is the stack runner a backbone's seam
takes (``DinoVim.stack_runner``); :class:`GraphedStages` replays an MLLA's stages,
one graph per stage and grid (``MLLA.stage_runner``: a hierarchical backbone's
eager step issues about 60 launches per block). :func:`graph_blocks` sets them on
every backbone of a model (what :class:`~mmdinomamba.engine.hooks.CUDAGraphBlocksHook`
does).

* Training (grad enabled, and the input or a block's parameter needs a gradient):
  the forward and the backward (``torch.autograd.grad`` of the outputs) are
  captured, after a warm-up on a side stream, and one autograd function replays
  them; copies of the parameters' gradients leave through autograd as in eager mode
  (accumulated into ``.grad``).
* No grad (DINO's teacher): the forward alone is captured.

Each signature has its own memory pool, so graphs of different signatures can be
replayed in any order. A replay returns copies of the graph's outputs (one
memory-bound pass: a caller may keep them across replays). What the backward graph
reads stays in the pool, so a second training forward of one signature before the
first one's backward has run would overwrite it; that forward runs eagerly instead.

The numbers are eager's: the same kernels run, and stochastic depth draws from the
default CUDA generator, which a replay advances as eager calls would; the generator
state is restored after each capture's warm-up, so a run that captures at step k
(after a resume) draws what an uninterrupted run draws.
"""
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

Tensor = torch.Tensor


class _Stack(nn.Module):
    """``(tokens) -> (h, residual)`` through every block; holds the blocks without
    registering them (the backbone owns them: no second name in a state dict).
    ``run`` runs them (the backbone's own way, e.g. one fused call); None: one
    ``layer(h, residual)`` after the other."""

    def __init__(self, layers: nn.ModuleList, training: bool,
                 run: Optional[Callable[..., Tuple[Tensor, ...]]] = None,
                 context: tuple = ()):
        super().__init__()
        self.__dict__['_layers'] = layers
        self.__dict__['_run'] = run
        self.context = context  # what run takes after the tokens (an MLLA stage's grid)
        self._params = tuple(layers.parameters())
        self.training = training

    def parameters(self, recurse: bool = True):
        return iter(self._params)

    def buffers(self, recurse: bool = True):
        return iter(())

    def forward(self, tokens: Tensor) -> Tuple[Tensor, Tensor]:
        if self.__dict__['_run'] is not None:
            return self.__dict__['_run'](tokens, *self.context)
        h, residual = tokens, None
        for layer in self.__dict__['_layers']:
            h, residual = layer(h, residual)
        return h, residual


def _autocast_without_cache():
    """The caller's CUDA autocast state with its weight cache off: a graph must
    record every cast, not read a cached copy that the autocast region frees."""
    return torch.autocast('cuda', dtype=torch.get_autocast_dtype('cuda'),
                          enabled=torch.is_autocast_enabled('cuda'), cache_enabled=False)


class GraphedBlocks:
    """Runs ``layers`` (blocks called as ``layer(h, residual)``) from CUDA graphs.

    Args:
        layers (nn.ModuleList): the blocks; the first gets ``residual=None``.
        run (callable, optional): ``(tokens, *context) -> outputs`` (a tuple of
            tensors, e.g. ``(h, residual)``) through every block, the way the
            backbone runs them eagerly (what is captured, so a replay makes the
            eager numbers and random draws); None calls the layers one after the
            other.
        warmup (int): eager iterations before each capture. Defaults to 3.
        max_signatures (int): captures kept at most; inputs of further signatures
            run eagerly (each capture holds its own memory: inputs of many sizes,
            as multi-scale training or whole-image testing make, must not pile
            them up). Defaults to 8.
    """

    def __init__(self, layers: nn.ModuleList,
                 run: Optional[Callable[[Tensor], Tuple[Tensor, Tensor]]] = None,
                 warmup: int = 3, max_signatures: int = 8):
        self.layers = layers
        self.run = run
        self.warmup = warmup
        self.max_signatures = max_signatures
        self._graphs: Dict[tuple, object] = {}
        self._pending: Dict[tuple, bool] = {}
        self._full = False  # warned that max_signatures is reached

    @staticmethod
    def takes(tokens: Tensor) -> bool:
        """Whether a call with ``tokens`` can replay a graph: CUDA, not inside a
        capture of someone else's or under ``torch.compile``."""
        return (tokens.is_cuda and not torch.compiler.is_compiling()
                and not torch.cuda.is_current_stream_capturing())

    def _key(self, tokens: Tensor, training: bool, context: tuple = ()) -> tuple:
        """The signature: what the captured work depends on. ``grad`` (position 5):
        whether anything needs a gradient, the input or a block's parameter (which
        of them do is part of the key: freezing blocks makes a new capture)."""
        trainable = tuple(p.requires_grad for p in self.layers.parameters())
        grad = torch.is_grad_enabled() and (tokens.requires_grad or any(trainable))
        return (tuple(tokens.shape), tokens.dtype, tokens.device, tokens.stride(),
                training, grad, torch.is_autocast_enabled('cuda'),
                torch.get_autocast_dtype('cuda'), tokens.requires_grad,
                trainable if grad else (), context)

    def __call__(self, tokens: Tensor, training: bool,
                 context: tuple = ()) -> Tuple[Tensor, ...]:
        """``(h, residual)`` after the last block (what ``run`` returns), as the
        eager loop returns them.

        Args:
            tokens (Tensor): (batch, seqlen, dim), CUDA (see :meth:`takes`).
            training (bool): the backbone's mode (stochastic depth).
            context (tuple): hashable arguments of ``run`` after the tokens (part
                of the signature: an MLLA stage's grid). Defaults to ().
        """
        key = self._key(tokens, training, context)
        grad = key[5]
        if grad and self._pending.get(key):
            # see the module docstring
            return _Stack(self.layers, training, self.run, context)(tokens)
        graphed = self._graphs.get(key)
        if graphed is None:
            if len(self._graphs) >= self.max_signatures:
                if not self._full:
                    warnings.warn(f'GraphedBlocks: {self.max_signatures} input '
                                  'signatures captured; further ones run eagerly')
                    self._full = True
                return _Stack(self.layers, training, self.run, context)(tokens)
            graphed = self._graphs[key] = self._capture(tokens, training, grad, context)
        if not grad:
            return graphed(tokens)
        self._pending[key] = True
        outs = graphed(tokens)

        def done(grad_h):
            self._pending[key] = False

        outs[0].register_hook(done)
        return outs

    def _capture(self, tokens: Tensor, training: bool, grad: bool, context: tuple = ()):
        rng = torch.cuda.get_rng_state(tokens.device)
        stack = _Stack(self.layers, training, self.run, context)
        try:
            with _autocast_without_cache():
                capture = _capture_training if grad else _capture_forward
                return capture(stack, tokens, self.warmup)
        except RuntimeError as err:  # something in the blocks cannot be captured
            warnings.warn(f'GraphedBlocks: capturing the blocks for input '
                          f'{tuple(tokens.shape)} failed ({str(err).splitlines()[0]}); '
                          'they run eagerly for this input')
            return stack
        finally:
            torch.cuda.set_rng_state(rng, tokens.device)


# 'thread_local': only this thread's CUDA calls can spoil a capture, not those of
# the data loader's pin-memory thread (with 'global', an intermittent failure)
_MODE = 'thread_local'


def _warm_up(fn, device, warmup: int):
    """``warmup`` calls of ``fn`` on a side stream (lazy initialisations, Triton's
    compilations and cuBLAS's workspaces happen before the capture).

    The caching allocator keeps what a stream freed for that stream alone: left
    cached, a training warm-up's activations (a whole step's worth, gigabytes at
    DINO's batch) would stay reserved for a stream nobody uses again, once per
    signature. They are handed back before the capture."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize(device)  # every stream: the capture follows the warm-up
    torch.cuda.empty_cache()


def _capture_forward(stack: _Stack, tokens: Tensor, warmup: int):
    """A replay function for the no-grad forward of ``stack`` on ``tokens``' shape."""
    static_in = tokens.detach().clone()
    with torch.no_grad():
        _warm_up(lambda: stack(static_in), tokens.device, warmup)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode=_MODE):
            static_out = stack(static_in)

    def replay(x: Tensor) -> Tuple[Tensor, Tensor]:
        static_in.copy_(x)
        graph.replay()
        return tuple(o.clone() for o in static_out)

    return replay


class _Graphs:
    """The captured forward and backward of one signature and their static tensors."""

    def __init__(self, stack: _Stack, tokens: Tensor, warmup: int):
        self.params = [p for p in stack.parameters() if p.requires_grad]
        self.static_in = tokens.detach().clone().requires_grad_(tokens.requires_grad)
        self.input_grad = tokens.requires_grad
        inputs = (self.static_in, ) * self.input_grad + tuple(self.params)

        def fwd_bwd():
            outs = stack(self.static_in)
            torch.autograd.grad(outs, inputs, [torch.empty_like(o) for o in outs],
                                allow_unused=True)

        _warm_up(fwd_bwd, tokens.device, warmup)
        self.fwd, self.bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.fwd, capture_error_mode=_MODE):
            self.static_out = stack(self.static_in)
        self.static_grad_out = tuple(torch.empty_like(o) for o in self.static_out)
        with torch.cuda.graph(self.bwd, pool=self.fwd.pool(), capture_error_mode=_MODE):
            self.static_grads = torch.autograd.grad(
                self.static_out, inputs, self.static_grad_out, allow_unused=True)


class _Replay(torch.autograd.Function):
    """One autograd node for the whole stack: the forward and the backward graph."""

    @staticmethod
    def forward(ctx, graphs: _Graphs, tokens: Tensor, *params: Tensor):
        if tokens.data_ptr() != graphs.static_in.data_ptr():
            graphs.static_in.detach().copy_(tokens)
        graphs.fwd.replay()
        ctx.graphs = graphs
        return tuple(o.detach().clone() for o in graphs.static_out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: Tensor):
        graphs = ctx.graphs
        for static, g in zip(graphs.static_grad_out, grads):
            static.copy_(g)
        graphs.bwd.replay()
        # copies, in a few multi-tensor launches: autograd may keep a gradient it is
        # handed as a parameter's .grad, and a static buffer kept there would be
        # rewritten by the next replay (and added twice where .grad is zeroed in
        # place instead of set to None)
        grads = list(graphs.static_grads)
        live = [i for i, g in enumerate(grads) if g is not None]
        if live:
            for i, g in zip(live, torch._foreach_mul([grads[i] for i in live], 1.0)):
                grads[i] = g
        return (None, grads.pop(0) if graphs.input_grad else None, *grads)


def _capture_training(stack: _Stack, tokens: Tensor, warmup: int):
    """A function replaying ``stack``'s forward on ``tokens``' shape, whose backward
    replays the captured backward."""
    graphs = _Graphs(stack, tokens, warmup)

    def replay(x: Tensor) -> Tuple[Tensor, Tensor]:
        return _Replay.apply(graphs, x, *graphs.params)

    replay.graphs = graphs  # for inspection
    return replay


class GraphedStack:
    """A backbone's stack runner (its ``stack_runner`` seam) that replays from CUDA
    graphs the calls running every block for the last one's output (training and
    plain inference), through :class:`GraphedBlocks`; every other call (CPU inputs,
    intermediate blocks' outputs, under ``torch.compile``) runs the backbone's own
    :meth:`run_blocks`.

    Args:
        backbone (nn.Module): has ``layers``, ``training`` and
            ``run_blocks(tokens, indices) -> [(h, residual), ...]`` (DinoVim).
        **kwargs: ``warmup`` and ``max_signatures`` of :class:`GraphedBlocks`.
    """

    def __init__(self, backbone: nn.Module, **kwargs):
        self.backbone = backbone
        self.last = len(backbone.layers) - 1
        self.graphs = GraphedBlocks(backbone.layers, self._run_all, **kwargs)

    def _run_all(self, tokens: Tensor) -> Tuple[Tensor, Tensor]:
        """The last block's ``(h, residual)`` the backbone's own way: what is
        captured."""
        return self.backbone.run_blocks(tokens, [self.last])[0]

    def __call__(self, tokens: Tensor, indices: Sequence[int]) -> List[Tuple[Tensor, Tensor]]:
        """``(h, residual)`` after each block of ``indices`` (sorted), as
        ``backbone.run_blocks`` returns them."""
        if list(indices) == [self.last] and self.graphs.takes(tokens):
            return [self.graphs(tokens, self.backbone.training)]
        return self.backbone.run_blocks(tokens, indices)


class GraphedStages:
    """An MLLA's stage runner (its ``stage_runner`` seam) that replays each stage's
    blocks from CUDA graphs, one :class:`GraphedBlocks` per stage, keyed by the
    stage's grid too (inputs of another size capture again, up to
    ``max_signatures`` per stage, then run eagerly); every other call (CPU inputs,
    under ``torch.compile``) runs the stage's own way.

    Args:
        backbone (nn.Module): has ``layers`` (stages with ``blocks``), ``training``
            and ``run_stage(i, tokens, hw) -> tokens`` (MLLA).
        **kwargs: ``warmup`` and ``max_signatures`` of :class:`GraphedBlocks`.
    """

    def __init__(self, backbone: nn.Module, **kwargs):
        self.backbone = backbone
        self.graphs = [GraphedBlocks(stage.blocks, self._runner(i), **kwargs)
                       for i, stage in enumerate(backbone.layers)]

    def _runner(self, i: int) -> Callable[..., Tuple[Tensor]]:
        return lambda tokens, hw: (self.backbone.run_stage(i, tokens, hw), )

    def __call__(self, i: int, tokens: Tensor, hw: Tuple[int, int]) -> Tensor:
        """Stage ``i``'s blocks on ``tokens`` (batch, h * w, C) of the grid ``hw``."""
        if self.graphs[i].takes(tokens):
            return self.graphs[i](tokens, self.backbone.training, (tuple(hw), ))[0]
        return self.backbone.run_stage(i, tokens, hw)


def graph_blocks(model: nn.Module, enabled: bool = True, **kwargs) -> List[str]:
    """Set a :class:`GraphedStack` as the stack runner of every submodule of
    ``model`` that has that seam (``stack_runner``: DinoVim), and a
    :class:`GraphedStages` as the stage runner of every one with ``stage_runner``
    (MLLA); with ``enabled`` False put their own back; return their names ('' for
    ``model`` itself). ``kwargs``: ``warmup``, ``max_signatures``."""
    names = []
    for name, module in model.named_modules():
        if hasattr(module, 'stack_runner'):
            module.stack_runner = GraphedStack(module, **kwargs) if enabled else None
            names.append(name)
        elif hasattr(module, 'stage_runner'):
            module.stage_runner = GraphedStages(module, **kwargs) if enabled else None
            names.append(name)
    return names
