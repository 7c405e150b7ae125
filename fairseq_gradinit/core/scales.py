"""Scale bookkeeping: which tensors get a scale, the fixed W_i, and writing alpha*W into a model."""
from __future__ import annotations

import logging
import math
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from .config import ScaleBound

logger = logging.getLogger(__name__)

ParamFilter = Callable[[str, nn.Parameter], bool]

#: Row length of the flat buffers: every W_i starts at a multiple of it (see ScaledParameters.capture).
CHUNK = 1024


class FlatViews(list):
    """Per-tensor views into one zero-padded buffer ``flat`` laid out like the W_i, so that a whole
    set of gradients can be worked on with single kernels over ``flat``."""

    def __init__(self, flat: torch.Tensor, views: Sequence[torch.Tensor]):
        super().__init__(views)
        self.flat = flat

_NORM_TYPES = tuple(t for t in (_NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", None)) if t is not None)


def _copy_all(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst, src)
    else:  # torch < 2.2
        for d, s in zip(dst, src):
            d.copy_(s)


def _contiguous_strides(shape: Sequence[int]) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def default_param_filter(name: str, param: nn.Parameter) -> bool:
    """Every parameter tensor that is not all zeros (a scale of zero biases would do nothing)."""
    return bool(torch.count_nonzero(param.detach()).item() > 0)


def shared_parameter_groups(model: nn.Module) -> List[List[str]]:
    """Names of the model's parameters, grouped by tensor (tied parameters share a group)."""
    groups: Dict[int, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return list(groups.values())


def _norm_weight_ids(model: nn.Module) -> set:
    """ids of the ``weight`` tensors of normalization layers."""
    ids = set()
    for m in model.modules():
        if isinstance(m, _NORM_TYPES) or type(m).__name__.endswith("Norm"):
            w = getattr(m, "weight", None)
            if isinstance(w, nn.Parameter):
                ids.add(id(w))
    return ids


def norm_weight_names(model: nn.Module) -> set:
    """Every name (aliases included) of the ``weight`` tensors of normalization layers: the tensors
    that a ``'norm'`` :class:`ScaleBound` selects."""
    ids = _norm_weight_ids(model)
    return {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in ids}


def matching_bound(name: str, param: Optional[nn.Parameter], bounds: Sequence, *, is_norm: bool):
    """Index and :class:`ScaleBound` of the first of ``bounds`` that selects the tensor ``name``
    (``is_norm``: it is a normalization layer's weight), or ``(None, None)``."""
    for k, b in enumerate(bounds):
        b = ScaleBound.coerce(b)
        sel = b.select
        if sel == "bias":
            hit = name.rsplit(".", 1)[-1] == "bias"
        elif sel == "norm":
            hit = is_norm
        elif isinstance(sel, str):
            hit = re.search(sel[3:], name) is not None
        else:
            hit = bool(sel(name, param))
        if hit:
            return k, b
    return None, None


def resolve_scale_bounds(model: nn.Module, names: Sequence[str], params: Sequence[nn.Parameter],
                         bounds: Sequence, *, min_scale: float, max_scale: Optional[float]):
    """Per-tensor (min, max) scale bounds: the first :class:`ScaleBound` of ``bounds`` that selects
    a tensor sets its bounds (``None`` fields keep the global ``min_scale``/``max_scale``)."""
    bounds = [ScaleBound.coerce(b) for b in bounds]
    norm_ids = _norm_weight_ids(model) if any(b.select == "norm" for b in bounds) else set()
    lo, hi, counts = [], [], [0] * len(bounds)
    for name, p in zip(names, params):
        b_lo, b_hi = min_scale, max_scale
        k, b = matching_bound(name, p, bounds, is_norm=id(p) in norm_ids)
        if b is not None:
            counts[k] += 1
            b_lo = b_lo if b.min_scale is None else float(b.min_scale)
            b_hi = b_hi if b.max_scale is None else float(b.max_scale)
        lo.append(b_lo)
        hi.append(math.inf if b_hi is None else b_hi)
    for b, n in zip(bounds, counts):
        if n == 0:
            logger.warning("gradinit: scale bound %r selects no scaled tensor", b.describe())
        else:
            logger.info("gradinit: scale bound %r: %d tensors in [%s, %s]", b.describe(), n, b.min_scale, b.max_scale)
    return lo, hi


class ScaledParameters:
    """The tensors theta_i of a model that GradInit moves, their fixed copies W_i and one scale
    alpha_i each.

    ``param_filter`` selects the tensors that get a learned scale. With ``include_unscaled``, the
    other trainable tensors are kept too with a scale fixed at 1 (their gradient enters g, ||g||
    and the simulated step, as in the real first step); ``scaled`` marks the learned ones.
    ``min_scales``/``max_scales`` hold each tensor's bounds (see :func:`resolve_scale_bounds`).
    ``fixed`` selects tensors that get a scale but that training does not update (``fixed`` marks them).
    """

    def __init__(self, model: nn.Module, param_filter: Optional[ParamFilter] = None, *,
                 include_unscaled: bool = False, bounds: Sequence = (), min_scale: float = 0.01,
                 max_scale: Optional[float] = None, fixed: Optional[ParamFilter] = None):
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
        scaled: List[bool] = []
        #: per tensor: scaled but not updated by training (out of g, ||g|| and the simulated step)
        self.fixed: List[bool] = []
        for key, p in params.items():
            first = names[key][0]
            if not p.requires_grad:
                continue
            learn = bool(filt(first, p))
            is_fixed = bool(fixed is not None and fixed(first, p))
            if not learn and (is_fixed or not include_unscaled):
                continue
            self.names.append(first)
            self.params.append(p)
            scaled.append(learn)
            self.fixed.append(is_fixed)
            if len(names[key]) > 1:
                self.aliases[first] = names[key][1:]
        if not any(scaled):
            raise ValueError(
                "GradInit found no parameter tensor to scale: the model has no trainable, non-zero "
                "parameters, or param_filter rejected all of them"
            )
        dev = self.params[0].device
        self.scaled = torch.tensor(scaled, dtype=torch.bool, device=dev)
        self.scaled_names = [n for n, k in zip(self.names, scaled) if k]
        keep = set(self.scaled_names)
        self.aliases = {n: a for n, a in self.aliases.items() if n in keep}
        learned = [(n, p) for n, p, k in zip(self.names, self.params, scaled) if k]
        lo, hi = resolve_scale_bounds(model, [n for n, _ in learned], [p for _, p in learned], bounds,
                                      min_scale=min_scale, max_scale=max_scale)
        it_lo, it_hi = iter(lo), iter(hi)
        # A tensor without a learned scale is pinned at 1 by bounds [1, 1].
        # Scales of a float64 model are float64 too (e.g. for checks against a reference loop).
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in self.params) else torch.float32
        floors = [next(it_lo) if k else 1.0 for k in scaled]
        self.min_scales = torch.tensor(floors, dtype=dtype, device=dev)
        #: per tensor, known without reading the device: a learned scale that cannot reach 0, so that
        #: <x, W_i> = <x, theta_i> / alpha_i (raising a floor keeps it above 0)
        self.learned_positive: List[bool] = [k and lo > 0 for k, lo in zip(scaled, floors)]
        #: per tensor: whether its scale is learned (``scaled`` on the host)
        self.learned: List[bool] = list(scaled)
        self.max_scales = torch.tensor([next(it_hi) if k else 1.0 for k in scaled], dtype=dtype, device=dev)
        self.W: List[torch.Tensor] = []
        self._flat: Optional[torch.Tensor] = None
        self._rows: List[torch.Tensor] = []
        self.alpha = torch.ones(len(self.params), dtype=dtype, device=dev)

    def raise_floors_for_step_ratio(self, eta: float, ratio: float) -> List[str]:
        """Raise the lower bound of every learned scale whose bound is above 0 to
        ``eta / (ratio * rms(W_i))`` (at most 1 and the upper bound); returns the names raised."""
        raised = []
        with torch.no_grad():
            for i, (name, p) in enumerate(zip(self.names, self.params)):
                lo = float(self.min_scales[i])
                if not bool(self.scaled[i]) or lo <= 0:
                    continue
                rms = p.detach().double().pow(2).mean().sqrt().item()
                floor = min(eta / (ratio * rms) if rms > 0 else 1.0, 1.0, float(self.max_scales[i]))
                if floor > lo:
                    self.min_scales[i] = floor
                    raised.append(name)
        return raised

    def capture(self) -> None:
        """Record the current weights as the fixed W_i."""
        with torch.no_grad():
            for name, p in zip(self.names, self.params):
                if not torch.isfinite(p).all():
                    raise ValueError(f"parameter {name!r} holds non-finite values before GradInit; "
                                     "initialize the model first")
            first = self.params[0]
            if all(p.dtype == first.dtype and p.device == first.device for p in self.params):
                # One buffer holds every W_i, so that writing alpha*W into the model and the
                # products <dL/dtheta_i, W_i> cost a few kernels instead of a few per tensor (GPU
                # iterations of small models are bound by kernel launches). Each W_i starts at a
                # multiple of CHUNK and is followed by zeros up to the next one, so that the sums of
                # CHUNK-element rows never straddle two tensors. self.W are views into it.
                self._sizes = [p.numel() for p in self.params]
                padded = [-(-n // CHUNK) * CHUNK for n in self._sizes]
                self._offsets = [sum(padded[:k]) for k in range(len(padded))]
                self._shapes = [tuple(p.shape) for p in self.params]
                self._strides = [_contiguous_strides(s) for s in self._shapes]
                self._flat = torch.zeros(sum(padded), dtype=first.dtype, device=first.device)
                self.W = self.views(self._flat)
                _copy_all(self.W, [p.detach() for p in self.params])
                self._counts = torch.tensor(padded, dtype=torch.long, device=first.device)
                rows = torch.tensor([0] + padded, dtype=torch.long).cumsum(0) // CHUNK
                self._row_bounds = rows.to(first.device)
                self._rows = [w.reshape(-1) for w in self.W]
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
            theta = self.flatten(direction).mul(-eta).addcmul_(self._flat, a)
        del a
        _copy_all(self.params, self.views(theta))

    def views(self, flat: torch.Tensor) -> "FlatViews":
        """The per-tensor views (shaped like the parameters) of a buffer laid out like the W_i."""
        base = flat.storage_offset()  # one view operator per tensor (a slice and a view would be two)
        return FlatViews(flat, [flat.as_strided(shape, stride, base + o)
                                for o, shape, stride in zip(self._offsets, self._shapes, self._strides)])

    def gather(self, tensors: Sequence[torch.Tensor]) -> "FlatViews":
        """A new zero-padded buffer laid out like the W_i holding ``tensors`` (one per parameter),
        as views (two kernels); ``tensors`` themselves where the W_i are not in one buffer."""
        if self._flat is None or isinstance(tensors, FlatViews):
            return tensors if isinstance(tensors, FlatViews) else list(tensors)
        out = self.views(torch.zeros_like(self._flat))
        _copy_all(out, tensors)
        return out

    def flatten(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """The buffer of :meth:`gather` (without a copy where ``tensors`` are its views already)."""
        return self.gather(tensors).flat

    def alpha_grad(self, grads: Sequence[torch.Tensor], dtype: Optional[torch.dtype] = None, *,
                   consume: bool = False) -> torch.Tensor:
        """dL/dalpha_i = <dL/dtheta_i, W_i> for the gradients ``grads`` w.r.t. the parameters,
        accumulated in ``dtype`` (default: that of the scales; 0 for tensors without a learned scale).
        With ``consume``, :class:`FlatViews` ``grads`` are overwritten (no temporary of the model's size)."""
        dev = self.alpha.device
        dtype = dtype or self.alpha.dtype
        if self._flat is not None:
            owned = consume or not isinstance(grads, FlatViews)
            out = self._flat_dots(self.flatten(grads), dtype, owned)
            return out if self._all_scaled else out * self.scaled
        out = []
        for g, w in zip(grads, self._rows):
            g = g.reshape(-1)
            if g.dtype != dtype or w.dtype != dtype:
                g, w = g.to(dtype), w.to(dtype)
            out.append(torch.dot(g, w).to(dev))
        out = torch.stack(out)
        return out if self._all_scaled else out * self.scaled

    def _flat_dots(self, flat: torch.Tensor, dtype: torch.dtype, owned: bool) -> torch.Tensor:
        """<flat_i, W_i> for every tensor i of a buffer laid out like the W_i: the products summed in
        CHUNK-element rows (in ``dtype``, at least float32), the rows of each tensor in float64. The
        sums are deterministic (no atomics) and at least as accurate as one float32 dot per tensor."""
        acc = torch.promote_types(dtype, torch.float32)
        if flat.dtype == acc and self._flat.dtype == acc:
            prod = flat.mul_(self._flat) if owned else flat * self._flat
        else:  # products in the accumulation dtype (float64 for a finite difference of two of them)
            prod = flat.to(acc).mul_(self._flat.to(acc))
        rows = prod.view(-1, CHUNK).sum(1, dtype=torch.float64)
        del prod
        ends = torch.cat([rows.new_zeros(1), rows.cumsum(0)])[self._row_bounds]
        return (ends[1:] - ends[:-1]).to(dtype)

    def without_fixed(self, grads: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """``grads`` with zeros for the fixed tensors (what enters g, ||g|| and the step); a new
        buffer where ``grads`` are :class:`FlatViews`, which stay untouched."""
        if not any(self.fixed):
            return grads if isinstance(grads, FlatViews) else list(grads)
        if isinstance(grads, FlatViews):
            out = self.views(grads.flat.clone())
            torch._foreach_zero_([t for t, f in zip(out, self.fixed) if f])
            return out
        return [torch.zeros_like(g) if f else g for g, f in zip(grads, self.fixed)]

    @property
    def _all_scaled(self) -> bool:
        return len(self.scaled_names) == len(self.names)

    def scales_dict(self) -> Dict[str, float]:
        """The learned scales by parameter name (tensors without a scale are left out)."""
        values = self.alpha.detach().cpu().tolist()
        return {n: v for n, v, k in zip(self.names, values, self.scaled.tolist()) if k}


def scales_error(scales: Mapping[str, float], dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why ``scales`` (name -> scale) cannot be applied to a model, or None; every reader of saved
    scales checks them with this one rule.

    A scale must be a finite number > 0: a negative one flips the tensor's sign, and a zero one
    starts the tensor all zero. Biases (named ``*.bias``) may be 0, since bounds such as the
    authors' ``('bias', 0, None)`` let GradInit drive them there, and fairseq starts its biases at 0.
    With ``dtype`` (the dtype the scales will be applied in), a scale must also stay finite and, unless it
    is 0, above 0 in that dtype (:func:`scale_dtype_error`).
    """
    bad = [k for k, v in scales.items()
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        return f"scales that are not finite numbers: {bad[:5]}"
    if dtype is not None:
        for name, value in scales.items():
            error = scale_dtype_error(name, value, dtype)
            if error:
                return error
    negative = [k for k, v in scales.items() if v < 0]
    if negative:
        return (f"{len(negative)} negative scales, e.g. {negative[:5]}: a GradInit scale is >= 0 "
                "(a negative one flips the tensor's sign); these scales were not written by GradInit or were "
                "edited: recompute them")
    zero = [k for k, v in scales.items() if v == 0 and not k.endswith(".bias")]
    if zero:
        return (f"{len(zero)} scales of 0 on tensors that are not biases, e.g. {zero[:5]}: they would start the "
                "model with those weights all zero (only biases may be scaled to 0); recompute the scales "
                "with a minimum above 0 for these tensors")
    return None


def scale_dtype_error(name: str, value: float, dtype: torch.dtype) -> Optional[str]:
    """Why the finite scale ``value`` of ``name`` does not survive ``dtype``, the dtype of the tensor it
    multiplies, or None: one that becomes inf there (the weight would be inf), or one > 0 that becomes 0
    there (the weight would be all zero, which the rule of :func:`scales_error` refuses on a weight)."""
    if not dtype.is_floating_point or value == 0:
        return None
    cast = float(torch.tensor(float(value), dtype=dtype))
    if math.isinf(cast):
        return (f"the scale {value:g} of {name!r} is inf in {dtype} (the largest is {torch.finfo(dtype).max:g}), "
                "the dtype it is applied in; these scales were not written by GradInit or were edited: recompute them")
    if cast == 0:
        return (f"the scale {value:g} of {name!r} is 0 in {dtype} (the smallest above 0 is "
                f"{torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps:g}), the dtype it is applied in, "
                "and would make that tensor all zero; these scales were not written by GradInit or were edited: "
                "recompute them")
    return None


def _product_error(name: str, value: float, p: torch.Tensor, scaled: torch.Tensor) -> Optional[str]:
    """Why ``scaled`` = ``value`` * ``p`` in ``p``'s dtype is no usable weight, or None: values that
    overflow to inf, or a tensor with values that underflows to all zeros (a bias scaled by 0 may be zero)."""
    error = scale_dtype_error(name, value, p.dtype)
    if error:
        return error
    if not bool(torch.isfinite(scaled).all()) and bool(torch.isfinite(p).all()):
        return (f"the scale {value:g} of {name!r} makes values of that tensor overflow to inf in {p.dtype}, "
                "the dtype it is applied in; these scales were not written by GradInit or were edited: recompute them")
    if value != 0 and not bool(scaled.count_nonzero()) and bool(p.count_nonzero()):
        return (f"the scale {value:g} of {name!r} makes that tensor all zero in {p.dtype}, the dtype it is applied "
                "in; these scales were not written by GradInit or were edited: recompute them")
    return None


def _alias_conflicts(by_name: Mapping[str, nn.Parameter], scales: Mapping[str, float]) -> Optional[str]:
    """Why ``scales`` gives one tensor, under two of its names (tied weights), two different scales, or None."""
    first: Dict[int, tuple] = {}
    for name, value in scales.items():
        p = by_name.get(name)
        if p is None:
            continue
        seen = first.setdefault(id(p), (name, value))
        if float(seen[1]) != float(value):
            return (f"{seen[0]!r} and {name!r} are names of one tied tensor, but the scales give it "
                    f"{float(seen[1]):g} and {float(value):g}; a tensor gets one scale: give its names the same "
                    "scale, or only one of them")
    return None


def _as_number(value):
    """``value`` as a float where it is a number of any kind (a tensor, a numpy scalar), else as given."""
    if isinstance(value, (bool, str)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


@torch.no_grad()
def apply_scales(model: nn.Module, scales: Mapping[str, float], *, strict: bool = True) -> List[str]:
    """Multiply parameters of ``model`` in place by ``scales`` (e.g. a saved ``GradInitResult.scales``).

    Names may be any alias of a tied tensor; each tensor is scaled once. With ``strict``, a name
    that is not a parameter of the model raises ``ValueError``. Scales that :func:`scales_error`
    refuses (not finite, negative, 0 on a tensor that is not a bias) raise ``ValueError`` before
    any tensor changes, and so does any failure: the scaled tensors are computed before any is written
    (all or nothing; it takes memory for one copy of the scaled weights meanwhile). Returns the names
    applied.
    """
    error = scales_error({k: _as_number(v) for k, v in scales.items()})
    if error:
        raise ValueError(f"cannot apply these scales: {error}")
    by_name: Dict[str, nn.Parameter] = dict(model.named_parameters(remove_duplicate=False))
    missing = [n for n in scales if n not in by_name]
    if missing and strict:
        raise ValueError(f"scales name parameters the model does not have: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}; was the result computed for this architecture?")
    conflict = _alias_conflicts(by_name, scales)
    if conflict:
        raise ValueError(f"cannot apply these scales: {conflict}")
    done, staged = set(), []
    for name, value in scales.items():  # every product first: a failure leaves the model as it was given
        p = by_name.get(name)
        if p is None or id(p) in done:
            continue
        if not p.is_floating_point():
            raise ValueError(f"cannot apply these scales: {name!r} is a {p.dtype} tensor, which a scale cannot "
                             "multiply in place; scales apply to floating-point weights")
        if p.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(f"cannot apply these scales: {name!r} is an inference tensor (made under "
                             "torch.inference_mode()), which cannot be changed in place outside it")
        scaled = p.detach() * float(value)
        error = _product_error(name, float(value), p.detach(), scaled)
        if error:
            raise ValueError(f"cannot apply these scales: {error}")
        staged.append((name, p, scaled))
        done.add(id(p))
    for _, p, scaled in staged:  # then all or nothing: a copy of equal shape and dtype does not fail
        p.copy_(scaled)
    return [name for name, _, _ in staged]


def summarize_scales(scales: Mapping[str, float], group_of: Callable[[str], str]) -> Dict[str, Dict[str, float]]:
    """min/mean/max/count of the scales in each group ``group_of(name)``."""
    groups: Dict[str, List[float]] = {}
    for name, value in scales.items():
        groups.setdefault(group_of(name), []).append(float(value))
    return {
        g: {"count": len(v), "min": min(v), "mean": sum(v) / len(v), "max": max(v)}
        for g, v in sorted(groups.items())
    }


def clamp_scales(model: nn.Module, scales: Mapping[str, float], bounds: Sequence) -> Dict[str, Dict[str, float]]:
    """Clamp saved ``scales`` of ``model``'s tensors into per-group ``bounds`` (:class:`ScaleBound`
    items or ``(select, min, max)`` tuples, first match wins; tensors that no bound selects, and
    bounds left at None, are not changed).

    Returns ``{"scales": clamped, "changed": {name: [before, after]}}``. Names that are not
    parameters of ``model`` (e.g. per-use multipliers) are matched by ``"bias"`` and ``"re:"`` only.
    """
    by_name: Dict[str, nn.Parameter] = dict(model.named_parameters(remove_duplicate=False))
    names = list(scales)
    lo, hi = resolve_scale_bounds(model, names, [by_name.get(n) for n in names], bounds,
                                  min_scale=-math.inf, max_scale=None)
    clamped, changed = {}, {}
    for name, a, b in zip(names, lo, hi):
        before = float(scales[name])
        after = min(max(before, a), b)
        clamped[name] = after
        if after != before:
            changed[name] = [before, after]
    return {"scales": clamped, "changed": changed}
