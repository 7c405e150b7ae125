"""What normalization layers see: the scale of their inputs and the gain they apply to them.

A LayerNorm divides its input by the input's standard deviation sigma and multiplies by its weight
gamma, so the layer amplifies perturbations of its input by about |gamma| / sigma. GradInit scales
both gamma and the layers that produce sigma; a tiny sigma (the residual stream switched off by a
small scale) makes the next LayerNorm a large amplifier of whatever later updates add to it.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, Optional

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase


@dataclass
class NormInputStats:
    """Statistics of one normalization layer's input in one forward pass."""

    #: Standard deviation of the input over the normalized features (LayerNorm: per position,
    #: averaged over positions whose input is not constant, e.g. not padding; BatchNorm: per
    #: channel over batch and space, averaged over channels).
    input_std: float
    #: Mean |weight| of the layer (1 without an affine weight).
    weight_abs_mean: float
    #: weight_abs_mean / input_std: how much the layer amplifies its input.
    gain: float
    #: Positions (LayerNorm) or channels (BatchNorm) averaged.
    count: int

    def to_dict(self) -> dict:
        return asdict(self)


def is_stat_norm(module: nn.Module) -> bool:
    """A LayerNorm-like (``normalized_shape``) or BatchNorm layer, whose input statistics are measured."""
    return isinstance(module, _NormBase) or hasattr(module, "normalized_shape")


def _input_std(module: nn.Module, x: torch.Tensor) -> tuple:
    x = x.detach().float()
    if isinstance(module, _NormBase):
        dims = [d for d in range(x.dim()) if d != 1]
        std = x.std(dim=dims, unbiased=False) if x.dim() > 1 else x.std(unbiased=False).reshape(1)
        return std.mean().item(), std.numel()
    nd = len(tuple(module.normalized_shape))
    std = x.reshape(-1, *x.shape[x.dim() - nd:]).flatten(1).std(dim=1, unbiased=False)
    real = std[std > 0]
    if real.numel() == 0:
        return 0.0, 0
    return real.mean().item(), real.numel()


@contextlib.contextmanager
def recording_norm_inputs(model: nn.Module,
                          select: Optional[Callable[[str, nn.Module], bool]] = None) -> Iterator[Dict[str, NormInputStats]]:
    """Within the context, every forward pass of a normalization layer of ``model`` records
    :class:`NormInputStats` into the yielded dict, by module name (a layer run several times
    keeps its last call)."""
    out: Dict[str, NormInputStats] = {}
    handles = []

    def hook_for(name: str):
        def hook(module, args):
            if not args or not torch.is_tensor(args[0]):
                return
            std, count = _input_std(module, args[0])
            w = getattr(module, "weight", None)
            w_abs = w.detach().float().abs().mean().item() if torch.is_tensor(w) else 1.0
            out[name] = NormInputStats(input_std=std, weight_abs_mean=w_abs,
                                       gain=(w_abs / std) if std > 0 else float("inf"), count=count)
        return hook

    for name, m in model.named_modules():
        if is_stat_norm(m) and (select is None or select(name, m)):
            handles.append(m.register_forward_pre_hook(hook_for(name)))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def norm_input_stats(model: nn.Module, forward: Callable[[nn.Module], Any], *,
                     select: Optional[Callable[[str, nn.Module], bool]] = None) -> Dict[str, NormInputStats]:
    """Run ``forward(model)`` once without gradients and return each normalization layer's
    :class:`NormInputStats`. The caller chooses the mode (``model.eval()`` or train)."""
    with recording_norm_inputs(model, select) as out:
        forward(model)
    return dict(out)
