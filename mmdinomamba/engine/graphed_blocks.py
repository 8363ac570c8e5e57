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
replayed in any order. At most ``max_signatures`` graphs are kept. Inference
runners (``graph_blocks(training=False)``: testing, the inferencers, benchmarks)
evict the least recently used: a new signature on a full cache frees the graph
(and its pool) of the signature used longest ago, so a dense pipeline whose input
sizes change keeps a bounded number of pools. Training runners keep their first
``max_signatures`` captures and run further signatures eagerly: a training capture
holds a step's activations and costs a few steps, and multi-scale training makes
a new size nearly every step, which under eviction would capture nearly every
step. With ``capture_after`` 2 or more a signature is
captured only once it recurs, so sizes seen once (a detector's rare image shapes)
run eagerly instead of paying a capture each (a capture costs a few eager passes:
the warm-up and the capture). A replay returns copies of the graph's outputs (one
memory-bound pass: a caller may keep them across replays). What the backward graph
reads stays in the pool, so a second training forward of one signature before the
first one's backward has run would overwrite it; that forward runs eagerly instead.

The numbers are eager's: the same kernels run, and stochastic depth draws from the
default CUDA generator, which a replay advances as eager calls would; the generator
state is restored after each capture's warm-up, so a run that captures at step k
(after a resume) draws what an uninterrupted run draws.
"""
import warnings
from collections import OrderedDict
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
        max_signatures (int): captures kept at most (each holds its own memory:
            inputs of many sizes, as multi-scale training or whole-image testing
            make, must not pile them up). Defaults to 8.
        evict (bool): what a new signature on a full cache does: True frees the
            least recently used signature's graph and captures it; False runs
            it eagerly. Defaults to False.
        capture_after (int): calls of a signature before it is captured (the
            earlier ones run eagerly); 1 captures on the first call. Defaults to 1.
        training (bool): whether calls that need a gradient replay graphs; False
            runs them eagerly (inference graphs only). Defaults to True.
    """

    def __init__(self, layers: nn.ModuleList,
                 run: Optional[Callable[[Tensor], Tuple[Tensor, Tensor]]] = None,
                 warmup: int = 3, max_signatures: int = 8, capture_after: int = 1,
                 training: bool = True, evict: bool = False):
        for name, value in (('max_signatures', max_signatures),
                            ('capture_after', capture_after)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'GraphedBlocks: {name} must be a positive int, '
                                 f'got {value!r}')
        self.layers = layers
        self.run = run
        self.warmup = warmup
        self.max_signatures = max_signatures
        self.capture_after = capture_after
        self.training = training
        self.evict = evict
        # signature -> replay function, least recently used first
        self._graphs: 'OrderedDict[tuple, object]' = OrderedDict()
        # signature -> calls so far, of signatures not captured (bounded, oldest out)
        self._seen: 'OrderedDict[tuple, int]' = OrderedDict()
        self._pending: Dict[tuple, bool] = {}
        self._full = False  # warned that max_signatures is reached
        self.evictions = 0  # graphs freed to make room (for inspection)

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
        if grad and (not self.training or self._pending.get(key)):
            # see the module docstring
            return _Stack(self.layers, training, self.run, context)(tokens)
        graphed = self._graphs.get(key)
        if graphed is None:
            if not self._admit(key):
                return _Stack(self.layers, training, self.run, context)(tokens)
            graphed = self._graphs[key] = self._capture(tokens, training, grad, context)
        else:
            self._graphs.move_to_end(key)
        if not grad:
            return graphed(tokens)
        self._pending[key] = True
        outs = graphed(tokens)

        def done(grad_h):
            self._pending[key] = False

        outs[0].register_hook(done)
        return outs

    def needs_grad(self, tokens: Tensor) -> bool:
        """Whether a call on ``tokens`` now is a training signature (grad enabled,
        and the input or a block's parameter needs a gradient)."""
        return torch.is_grad_enabled() and (tokens.requires_grad or any(
            p.requires_grad for p in self.layers.parameters()))

    def _admit(self, key: tuple) -> bool:
        """Whether the uncaptured signature ``key`` is captured now: on its
        ``capture_after``-th call, if fewer than ``max_signatures`` are kept or
        ``evict`` frees the least recently used one's graph."""
        calls = self._seen.pop(key, 0) + 1
        if calls < self.capture_after:
            self._seen[key] = calls
            while len(self._seen) > 64 * self.max_signatures:
                self._seen.popitem(last=False)
            return False
        if len(self._graphs) >= self.max_signatures:
            if not self._full:
                warnings.warn(
                    f'GraphedBlocks: more than {self.max_signatures} input signatures; '
                    + ('the least recently used one\'s graph is freed for each new one '
                       '(raise max_signatures if sizes recur)' if self.evict else
                       'further ones run eagerly'))
                self._full = True
            if not self.evict:
                self._seen[key] = calls
                return False
            old, _ = self._graphs.popitem(last=False)
            if not self._pending.get(old):
                self._pending.pop(old, None)
            self.evictions += 1
        return True

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
    graphs, through :class:`GraphedBlocks`, the calls running every block for the
    last one's output (training and plain inference) and, without gradients, those
    for any set of blocks' outputs (a dense model's feature maps, keyed by the set);
    every other call (CPU inputs, training calls for intermediate outputs, under
    ``torch.compile``) runs the backbone's own :meth:`run_blocks`.

    Args:
        backbone (nn.Module): has ``layers``, ``training`` and
            ``run_blocks(tokens, indices) -> [(h, residual), ...]`` (DinoVim).
        **kwargs: ``warmup``, ``max_signatures``, ``capture_after``,
            ``training`` and ``evict`` of :class:`GraphedBlocks`.
    """

    def __init__(self, backbone: nn.Module, **kwargs):
        self.backbone = backbone
        self.last = len(backbone.layers) - 1
        self.graphs = GraphedBlocks(backbone.layers, self._run, **kwargs)

    def _run(self, tokens: Tensor, indices: Tuple[int, ...]) -> Tuple[Tensor, ...]:
        """``(h, residual)`` after each block of ``indices``, flattened, the
        backbone's own way: what is captured."""
        pairs = self.backbone.run_blocks(tokens, list(indices))
        return tuple(t for pair in pairs for t in pair)

    def __call__(self, tokens: Tensor, indices: Sequence[int]) -> List[Tuple[Tensor, Tensor]]:
        """``(h, residual)`` after each block of ``indices`` (sorted), as
        ``backbone.run_blocks`` returns them."""
        indices = tuple(indices)
        if self.graphs.takes(tokens) and (
                indices == (self.last, ) or not self.graphs.needs_grad(tokens)):
            flat = self.graphs(tokens, self.backbone.training, (indices, ))
            return list(zip(flat[0::2], flat[1::2]))
        return self.backbone.run_blocks(tokens, indices)


class GraphedStages:
    """An MLLA's stage runner (its ``stage_runner`` seam) that replays each stage's
    blocks from CUDA graphs, one :class:`GraphedBlocks` per stage, keyed by the
    stage's grid too (inputs of another size capture again, up to
    ``max_signatures`` per stage); every other call (CPU inputs,
    under ``torch.compile``) runs the stage's own way.

    Args:
        backbone (nn.Module): has ``layers`` (stages with ``blocks``), ``training``
            and ``run_stage(i, tokens, hw) -> tokens`` (MLLA).
        **kwargs: ``warmup``, ``max_signatures``, ``capture_after``,
            ``training`` and ``evict`` of :class:`GraphedBlocks`.
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


def graph_blocks(model: nn.Module, enabled: bool = True, training: bool = True,
                 **kwargs) -> List[str]:
    """Set a :class:`GraphedStack` as the stack runner of every submodule of
    ``model`` that has that seam (``stack_runner``: DinoVim), and a
    :class:`GraphedStages` as the stage runner of every one with ``stage_runner``
    (MLLA); with ``enabled`` False put their own back; return their names ('' for
    ``model`` itself).

    Args:
        model (nn.Module): any model; its backbones are found by their seams.
        enabled (bool): False removes the runners. Defaults to True.
        training (bool): whether calls that need a gradient replay graphs too
            (the captures beyond ``max_signatures`` then run eagerly); False
            graphs inference only (no-grad calls: testing, a benchmark's forward),
            runs training calls eagerly and evicts the least recently used graph
            for a new signature beyond ``max_signatures``. Defaults to True.
        **kwargs: ``warmup``, ``max_signatures`` and ``capture_after`` of
            :class:`GraphedBlocks` (``max_signatures`` defaults to 8, and
            ``capture_after`` to 1: capture on the first call).

    Inference at a few fixed sizes, as a benchmark runs it::

        graph_blocks(model, training=False, max_signatures=4)
    """
    options = dict(training=training, evict=not training, **kwargs)
    names = []
    for name, module in model.named_modules():
        if hasattr(module, 'stack_runner'):
            module.stack_runner = (GraphedStack(module, **options) if enabled else None)
            names.append(name)
        elif hasattr(module, 'stage_runner'):
            module.stage_runner = (GraphedStages(module, **options) if enabled else None)
            names.append(name)
    return names


def graphed_modules(model: nn.Module) -> List[str]:
    """The names of ``model``'s submodules whose blocks replay from CUDA graphs
    (their runner is a :class:`GraphedStack` or :class:`GraphedStages`)."""
    return [name for name, module in model.named_modules()
            if isinstance(getattr(module, 'stack_runner', None), GraphedStack)
            or isinstance(getattr(module, 'stage_runner', None), GraphedStages)]


def on_cuda(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are on a CUDA device (the first one's)."""
    param = next(model.parameters(), None)
    return param is not None and param.is_cuda
