"""Scale bookkeeping: which tensors get a scale, the fixed W_i, and writing alpha*W into a model."""
from __future__ import annotations

import logging
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import torch
from torch import nn

logger = logging.getLogger(__name__)

ParamFilter = Callable[[str, nn.Parameter], bool]


def _copy_all(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst, src)
    else:  # torch < 2.2
        for d, s in zip(dst, src):
            d.copy_(s)


def default_param_filter(name: str, param: nn.Parameter) -> bool:
    """Every parameter tensor that is not all zeros (a scale of zero biases would do nothing)."""
    return bool(torch.count_nonzero(param.detach()).item() > 0)


def shared_parameter_groups(model: nn.Module) -> List[List[str]]:
    """Names of the model's parameters, grouped by tensor (tied parameters share a group)."""
    groups: Dict[int, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return list(groups.values())


class ScaledParameters:
    """The selected tensors theta_i of a model, their fixed copies W_i and one scale alpha_i each."""

    def __init__(self, model: nn.Module, param_filter: Optional[ParamFilter] = None):
        filt = param_filter or default_param_filter
        params: Dict[int, nn.Parameter] = {}
        names: Dict[int, List[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in names:
                names[id(p)].append(name)
                continue
            names[id(p)] = [name]
            params[id(p)] = p
        self.names: List[str] = []
        self.params: List[nn.Parameter] = []
        self.aliases: Dict[str, List[str]] = {}
        for key, p in params.items():
            first = names[key][0]
            if not p.requires_grad or not filt(first, p):
                continue
            self.names.append(first)
            self.params.append(p)
            if len(names[key]) > 1:
                self.aliases[first] = names[key][1:]
        if not self.params:
            raise ValueError(
                "GradInit found no parameter tensor to scale: the model has no trainable, non-zero "
                "parameters, or param_filter rejected all of them"
            )
        self.W: List[torch.Tensor] = []
        self._flat: Optional[torch.Tensor] = None
        self._rows: List[torch.Tensor] = []
        self.alpha = torch.ones(len(self.params), dtype=torch.float32, device=self.params[0].device)

    def capture(self) -> None:
        """Record the current weights as the fixed W_i."""
        with torch.no_grad():
            for name, p in zip(self.names, self.params):
                if not torch.isfinite(p).all():
                    raise ValueError(f"parameter {name!r} holds non-finite values before GradInit; "
                                     "initialize the model first")
            first = self.params[0]
            if all(p.dtype == first.dtype and p.device == first.device for p in self.params):
                # One buffer holds every W_i, so that writing alpha*W into the model costs a few
                # kernels instead of a few per tensor (GPU iterations of small models are bound by
                # kernel launches). self.W are views into it.
                self._flat = torch.cat([p.detach().reshape(-1) for p in self.params])
                self._sizes = [p.numel() for p in self.params]
                self._counts = torch.tensor(self._sizes, dtype=torch.long, device=first.device)
                self._rows = list(self._flat.split(self._sizes))
                self.W = [w.view(p.shape) for w, p in zip(self._rows, self.params)]
            else:  # mixed dtypes or devices (e.g. model parallel): one op per tensor
                self._flat = None
                self.W = [p.detach().clone() for p in self.params]
                self._rows = [w.reshape(-1) for w in self.W]
        self.alpha.fill_(1.0)

    @torch.no_grad()
    def write(self, alpha: torch.Tensor, direction: Optional[Sequence[torch.Tensor]] = None,
              eta: float = 0.0) -> None:
        """theta_i <- alpha_i W_i, or alpha_i W_i - eta * direction_i."""
        if self._flat is None:
            scales = alpha.unbind()
            if direction is None:
                for p, w, a in zip(self.params, self.W, scales):
                    torch.mul(w, a.to(w.device), out=p.data)  # W_i is a clone of p: same dtype
            else:
                for p, w, a, d in zip(self.params, self.W, scales, direction):
                    p.copy_(torch.addcmul(-eta * d, w, a.to(w.device)))
            return
        # output_size keeps repeat_interleave free of a device-to-host sync.
        a = torch.repeat_interleave(alpha.to(self._flat.dtype), self._counts, output_size=self._flat.numel())
        if direction is None:
            theta = self._flat * a
        else:
            theta = torch.cat([d.reshape(-1) for d in direction]).mul_(-eta).addcmul_(self._flat, a)
        del a
        _copy_all(self.params, [t.view(p.shape) for t, p in zip(theta.split(self._sizes), self.params)])

    def alpha_grad(self, grads: Sequence[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """dL/dalpha_i = <dL/dtheta_i, W_i> for the gradients ``grads`` w.r.t. the parameters,
        accumulated in ``dtype``."""
        dev = self.alpha.device
        out = []
        for g, w in zip(grads, self._rows):
            g = g.reshape(-1)
            if g.dtype != dtype or w.dtype != dtype:
                g, w = g.to(dtype), w.to(dtype)
            d = torch.dot(g, w)
            out.append(d if self._flat is not None else d.to(dev))  # one buffer: already on dev
        return torch.stack(out)

    def scales_dict(self) -> Dict[str, float]:
        return dict(zip(self.names, self.alpha.detach().cpu().tolist()))


@torch.no_grad()
def apply_scales(model: nn.Module, scales: Mapping[str, float], *, strict: bool = True) -> List[str]:
    """Multiply parameters of ``model`` in place by ``scales`` (e.g. a saved ``GradInitResult.scales``).

    Names may be any alias of a tied tensor; each tensor is scaled once. With ``strict``, a name
    that is not a parameter of the model raises ``ValueError``. Returns the names applied.
    """
    by_name: Dict[str, nn.Parameter] = dict(model.named_parameters(remove_duplicate=False))
    missing = [n for n in scales if n not in by_name]
    if missing and strict:
        raise ValueError(f"scales name parameters the model does not have: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}; was the result computed for this architecture?")
    done, applied = set(), []
    for name, value in scales.items():
        p = by_name.get(name)
        if p is None or id(p) in done:
            continue
        value = float(value)
        if not torch.isfinite(torch.tensor(value)):
            raise ValueError(f"scale of {name!r} is not finite: {value}")
        p.mul_(value)
        done.add(id(p))
        applied.append(name)
    return applied


def summarize_scales(scales: Mapping[str, float], group_of: Callable[[str], str]) -> Dict[str, Dict[str, float]]:
    """min/mean/max/count of the scales in each group ``group_of(name)``."""
    groups: Dict[str, List[float]] = {}
    for name, value in scales.items():
        groups.setdefault(group_of(name), []).append(float(value))
    return {
        g: {"count": len(v), "min": min(v), "mean": sum(v) / len(v), "max": max(v)}
        for g, v in sorted(groups.items())
    }
