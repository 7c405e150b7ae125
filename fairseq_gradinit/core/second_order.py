"""The second-order pass of a constraint iteration, without the weight products of linear uses.

A constraint iteration needs d||g||_p / d alpha_i = <(H v)_i, W_i>, v = d||g||_p / dg, from a
backward pass through the first backward (the double backward). Autograd computes (H v)_i in full and
the dot with W_i follows. For a tensor that enters the loss only through linear operators, the dot
needs none of the full (H v)_i: take a use Y = x theta^T + b (``F.linear``; a convolution is the same
with its own products). theta enters the graph of
g twice, in Y and in the first backward's input gradient dX = dY theta, so the double backward's
(H v)_theta is a_Y^T x + dY^T a_dX, a_Y and a_dX being the adjoints of Y and dX that it computes
anyway on its way to earlier tensors. Hence

    <(H v)_theta, theta> = <a_Y, Y - b> + <a_dX, dX>,

two element-wise dots in place of two matrix products per use (of the six that a linear operator
costs in the double backward). An embedding lookup Y = theta[tokens] has no dX term, and the padding
row, which autograd holds constant, drops out with its positions. Summed over a tensor's uses and
divided by alpha_i (theta_i = alpha_i W_i), this is <(H v)_i, W_i>; it is exact, up to the order of
floating-point sums.

How: during the pass over S, a torch function mode (:class:`_Recorder`, on the calling thread's mode stack for
the pass only) records each use of an eligible tensor by ``torch.nn.functional.linear``, ``embedding`` and
``conv1d/2d/3d`` (its output Y, and the node whose gradient along the input's edge is dX). The first backward keeps dX
(a node hook); the double backward reduces a_Y and a_dX to their dots as it produces them (tensor
hooks), so none of them is held to its end. Every recorded output also depends on a 0-d zero, the
sink, added to its bias or its input: asking for the sink's gradient makes the double backward
compute every a_Y whatever else it is asked for. An a_dX it did not compute (a model whose dY does not
depend on anything that needs a gradient) makes the caller redo the pass with full products.

The rule holds only where every use of the tensor in the graph is one recorded here: a tensor also
used elsewhere (concatenated, normalized, multiplied by hand), a use whose output is modified in
place afterwards, or a scale whose lower bound is 0 (theta_i = 0 says nothing of W_i) keeps the
full product. :func:`gradient_with_graph` checks this on the forward graph of every pass.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from types import FunctionType
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .runtime import check_loss

__all__ = ["SecondOrderGraph", "gradient_with_graph", "hessian_vector_dots"]

#: The functions whose uses of a weight are recorded, as a torch function mode receives them (the
#: builtins ``F.linear`` and ``F.conv1d/2d/3d`` are, ``F.embedding`` is a Python function).
_LINEAR, _EMBEDDING = torch._C._nn.linear, F.embedding
_CONVS = (torch.conv1d, torch.conv2d, torch.conv3d)
_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_EMBEDDING_ARGS = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")


@dataclass
class _Use:
    """One use of a tensor by a linear operator in the recorded forward pass."""

    index: int
    #: the nodes of the use with an edge to the tensor's gradient accumulator
    nodes: List[object]
    #: the tensor's gradient accumulator
    accumulator: object
    y: torch.Tensor
    version: int
    bias: Optional[torch.Tensor] = None
    #: the dimension of Y the bias runs along (the last for a linear, the channels for a convolution)
    bias_dim: int = -1
    #: float mask of the non-padding positions (embedding uses with a padding index)
    mask: Optional[torch.Tensor] = None
    #: (node, edge) of the use whose gradient along that edge is the first backward's dX = dY theta
    #: (linear uses whose input has a gradient), and dX once the first backward has run
    x_edge: Optional[Tuple[object, int]] = None
    dx: Optional[torch.Tensor] = None


def _node(t: torch.Tensor):
    """The node the gradient of ``t`` goes to: its grad_fn, or a leaf's gradient accumulator."""
    return t.grad_fn if t.grad_fn is not None else t.view_as(t).grad_fn.next_functions[0][0]


def _use_nodes(y: torch.Tensor, accumulator, inputs: Sequence[Optional[torch.Tensor]], x: Optional[torch.Tensor]):
    """The nodes the operator that made ``y`` from ``inputs`` created: those with an edge to the
    weight's ``accumulator``, and the (node, edge) into ``x``'s producer (None where ``x`` has no
    gradient; False where more than one edge leads there)."""
    x_target = None
    if x is not None and x.requires_grad:
        x_target = (_node(x), x.output_nr)
    stop = {id(accumulator)} | {id(_node(t)) for t in inputs if t is not None and t.requires_grad}
    w_nodes, x_edges, stack, seen = [], [], [y.grad_fn], set()
    while stack:
        node = stack.pop()
        for k, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            if nxt is accumulator:
                w_nodes.append(node)
            if x_target is not None and nxt is x_target[0] and nr == x_target[1]:
                x_edges.append((node, k))
            if id(nxt) not in stop and id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)
    if x_target is None:
        return w_nodes, None
    return w_nodes, x_edges[0] if len(x_edges) == 1 else False


def _never(*args) -> bool:
    return False


@functools.lru_cache(maxsize=None)
def _unchecked(fn):
    """``fn``, a Python function of ``torch.nn.functional``, without its own ``__torch_function__`` check.

    A mode handles such a function with itself popped, so the function's body (``F.multi_head_attention_forward``'s
    projections) would run unseen; this copy, called with the mode pushed again, runs the body under the mode
    without dispatching to it a second time. Its globals are a snapshot of the module's, taken once.
    """
    scope = dict(fn.__globals__, has_torch_function=_never, has_torch_function_unary=_never,
                 has_torch_function_variadic=_never)
    clone = FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    return clone


def _bound(args, kwargs, names) -> Dict[str, object]:
    """The arguments of a call by position or by name, by name."""
    bound = dict(zip(names, args))
    bound.update(kwargs or {})
    return bound


class _Recorder(TorchFunctionMode):
    """Records the uses of the eligible tensors by ``F.linear``, ``F.embedding`` and ``F.conv1d/2d/3d``.

    A torch function mode: it lives on the calling thread's mode stack while entered, so it sees these
    functions however they were imported and changes nothing outside that thread and scope (an exception,
    ``KeyboardInterrupt`` included, pops it on its way out). The bodies of ``torch.nn.functional``'s other
    Python functions run under it too (:func:`_unchecked`), so that ``multi_head_attention_forward``'s
    projections are seen; a use elsewhere is left unrecorded and found by the graph check.
    Every recorded output also depends on ``sink``, a 0-d zero: asking the double backward for the
    sink's gradient makes it compute the adjoint of every output, whatever else it is asked for.
    """

    def __init__(self, index: Dict[int, int], like: torch.Tensor):
        super().__init__()
        self.index = index
        self.uses: List[_Use] = []
        self.accumulators: Dict[int, object] = {}
        self.sink = torch.zeros((), dtype=like.dtype, device=like.device, requires_grad=True)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _LINEAR:
            return self._linear(func, _bound(args, kwargs, ("input", "weight", "bias")))
        if func in _CONVS:
            return self._conv(func, _bound(args, kwargs, _CONV_ARGS))
        if func is _EMBEDDING:
            return self._embedding(func, _bound(args, kwargs, _EMBEDDING_ARGS))
        if getattr(func, "__module__", None) == F.__name__ and "handle_torch_function" in getattr(
                getattr(func, "__code__", None), "co_names", ()):
            with self:
                return _unchecked(func)(*args, **kwargs)
        return func(*args, **kwargs)

    def _accumulator(self, weight: torch.Tensor):
        """The weight's gradient accumulator, one per weight and pass (its uses share it)."""
        if id(weight) not in self.accumulators:
            self.accumulators[id(weight)] = _node(weight)
        return self.accumulators[id(weight)]

    def _mine(self, weight) -> Optional[int]:
        if not torch.is_grad_enabled():
            return None
        return self.index.get(id(weight))

    def _product(self, i, orig, input, weight, bias, rest, bias_dim):
        """Y = orig(input, weight, bias, **rest), an operator linear in the weight, recorded."""
        # Adding the 0-d zero leaves the values as they are; where it goes, it costs least:
        # into the bias, else into the input (whose gradient is dX either way).
        sink = self.sink.to(weight.dtype)
        b = bias
        if bias is not None:
            b = bias + sink
        elif input.requires_grad:
            input = input + sink
        else:
            b = sink.expand(weight.size(0))
        y = orig(input, weight, b, **rest)
        acc = self._accumulator(weight)
        nodes, x_edge = _use_nodes(y, acc, (input, b), input)
        if x_edge is False:
            nodes = []  # an input used twice: not a use this module knows; the graph check drops it
        self.uses.append(_Use(i, nodes, acc, y, y._version, bias=bias, bias_dim=bias_dim, x_edge=x_edge or None))
        return y

    def _linear(self, orig, a):
        input, weight, bias = a["input"], a["weight"], a.get("bias")
        i = self._mine(weight)
        if i is None or weight.dim() != 2:
            return orig(input, weight, bias)
        return self._product(i, orig, input, weight, bias, {}, -1)

    def _conv(self, orig, a):
        input, weight, bias = a.pop("input"), a.pop("weight"), a.pop("bias", None)
        i = self._mine(weight)
        if i is None:
            return orig(input, weight, bias, **a)
        # batched input (N, C, ...): channels are dimension 1; unbatched (C, ...): dimension 0
        return self._product(i, orig, input, weight, bias, a, 1 if input.dim() == weight.dim() else 0)

    def _embedding(self, orig, a):
        input, weight, padding_idx = a.pop("input"), a.pop("weight"), a.get("padding_idx")
        i = self._mine(weight)
        y = orig(input, weight, **a)
        if i is None or a.get("max_norm") is not None or a.get("scale_grad_by_freq") or a.get("sparse"):
            # renormed rows and frequency-scaled gradients are not linear in the weight
            return y
        y = y + self.sink.to(y.dtype)
        acc = self._accumulator(weight)
        nodes, _ = _use_nodes(y, acc, (self.sink,), None)
        mask = None
        if padding_idx is not None:
            pad = padding_idx + weight.size(0) if padding_idx < 0 else padding_idx
            mask = (input != pad).unsqueeze(-1).to(y.dtype)
        self.uses.append(_Use(i, nodes, acc, y, y._version, mask=mask))
        return y


def _foreign(root, accumulators: Dict[int, int], ours: set) -> set:
    """Indices of the tensors whose gradient accumulator is reached from ``root`` by an edge that
    is not one of the recorded uses."""
    foreign, seen, stack = set(), set(), [root]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            k = id(nxt)
            if k in accumulators:
                if id(node) not in ours:
                    foreign.add(accumulators[k])
            elif k not in seen:
                seen.add(k)
                stack.append(nxt)
    return foreign


@dataclass
class SecondOrderGraph:
    """This rank's gradient on S with its graph, and the recorded uses the double backward reads."""

    #: d L / d params (``None`` where unused), each with its graph
    grads: Tuple[Optional[torch.Tensor], ...]
    #: the uses of tensors whose every use was recorded (the others keep the full product)
    uses: List[_Use]
    sink: Optional[torch.Tensor] = None

    @property
    def covered(self) -> frozenset:
        """Indices of the tensors covered by ``uses``."""
        return frozenset(u.index for u in self.uses)


def gradient_with_graph(model, loss_fn, batch, params: Sequence[torch.Tensor], eligible: Sequence[bool]):
    """(L(batch), :class:`SecondOrderGraph`): the forward pass with the uses of the ``eligible``
    tensors recorded, and the first backward with its graph."""
    index = {id(p): i for i, (p, ok) in enumerate(zip(params, eligible)) if ok}
    rec = _Recorder(index, params[0])
    with rec if index else contextlib.nullcontext():
        loss = check_loss(loss_fn(model, batch))
    uses = rec.uses
    if uses:
        accumulators = {id(u.accumulator): u.index for u in uses}
        ours = {id(n) for u in uses for n in u.nodes}
        bad = _foreign(loss.grad_fn, accumulators, ours) if loss.grad_fn else set()
        uses = [u for u in uses if u.index not in bad]
    # dX of each use, as the first backward computes it (before it is summed with other uses' terms)
    def capture(u: _Use):
        def hook(grad_inputs, grad_outputs):
            u.dx = grad_inputs[u.x_edge[1]]
        return hook

    handles = [u.x_edge[0].register_hook(capture(u)) for u in uses if u.x_edge is not None]
    try:
        grads = torch.autograd.grad(loss, list(params), create_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    # a use whose output was modified in place no longer holds its Y
    bad = {u.index for u in uses if u.y._version != u.version}
    uses = [u for u in uses if u.index not in bad]
    return loss, SecondOrderGraph(grads, uses, rec.sink if uses else None)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """<a, b> accumulated in at least float32."""
    acc = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    return torch.dot(a.reshape(-1).to(acc), b.reshape(-1).to(acc))


def _y_term(u: _Use, ay: torch.Tensor) -> torch.Tensor:
    """<a_Y, Y - b> (padding positions of an embedding left out)."""
    if u.mask is not None:
        ay = ay * u.mask
    t = _dot(ay, u.y.detach())
    if u.bias is not None:  # the bias is not part of x theta^T
        dims = [d for d in range(ay.dim()) if d != u.bias_dim % ay.dim()]
        t = t - _dot(ay.sum(dims), u.bias.detach())
    return t


def hessian_vector_dots(graph: SecondOrderGraph, params: Sequence[torch.Tensor], v: Sequence[torch.Tensor],
                        wanted: Sequence[bool], dtype: torch.dtype):
    """The double backward of ``graph`` along ``v``: (H v for each wanted tensor not covered by the
    recorded uses, zeros for the others; <(H v)_i, theta_i> per tensor, zero where not covered), or
    (None, None) where a recorded adjoint was not reached (then the graph is spent: redo the pass
    without recorded uses)."""
    used = [(g, vi) for g, vi in zip(graph.grads, v) if g is not None and g.requires_grad]
    n = len(params)
    dots = torch.zeros(n, dtype=dtype, device=params[0].device)
    hv = [torch.zeros_like(p) for p in params]
    full_idx = [i for i in range(n) if wanted[i] and i not in graph.covered]
    inputs = [params[i] for i in full_idx] + ([graph.sink] if graph.uses else [])
    if not used or not inputs:
        return hv, dots
    # Each adjoint is reduced to its dot as the double backward produces it, so that none of them
    # outlives its node. Slots in a fixed order (not the order the hooks fire in) keep the index of
    # their owners the same from one iteration to the next.
    with_dx = [u for u in graph.uses if u.dx is not None and u.dx.requires_grad]
    slots: List[Optional[torch.Tensor]] = [None] * (len(graph.uses) + len(with_dx))

    def y_hook(u: _Use, k: int):
        def fn(grad):
            slots[k] = _y_term(u, grad)
            u.y = u.mask = None  # the graph frees Y when it no longer needs it
        return fn

    def dx_hook(u: _Use, k: int):
        def fn(grad):
            slots[k] = _dot(grad, u.dx.detach())
            u.dx = None
        return fn

    handles = [u.y.register_hook(y_hook(u, k)) for k, u in enumerate(graph.uses)]
    handles += [u.dx.register_hook(dx_hook(u, len(graph.uses) + k)) for k, u in enumerate(with_dx)]
    try:
        adj = torch.autograd.grad([g for g, _ in used], inputs, grad_outputs=[vi for _, vi in used],
                                  allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    del used
    if any(t is None for t in slots):
        return None, None
    for i, h in zip(full_idx, adj):
        if h is not None:
            hv[i] = h
    if slots:
        owners = _owner_index([u.index for u in graph.uses] + [u.index for u in with_dx], dots.device)
        dots.index_add_(0, owners, torch.stack(slots).to(dtype))
    return hv, dots


_OWNERS: Dict[Tuple[torch.device, Tuple[int, ...]], torch.Tensor] = {}


def _owner_index(owners: List[int], device: torch.device) -> torch.Tensor:
    """``owners`` as an index tensor on ``device``, made once per model layout: from pinned memory
    without waiting for the device (an upload from pageable memory would synchronize it)."""
    key = (device, tuple(owners))
    if key not in _OWNERS:
        if len(_OWNERS) >= 8:
            _OWNERS.clear()
        index = torch.tensor(owners, dtype=torch.long)
        if device.type == "cuda":
            index = index.pin_memory().to(device, non_blocking=True)
        _OWNERS[key] = index.to(device)
    return _OWNERS[key]
