"""Per-tensor weight norms and cross-minibatch gradient spread before and after GradInit's scales.

The quantities of the paper's appendix figures ("Weight norms and gradient variances"), per
parameter tensor i:

- the learned scale alpha_i;
- the weight norm ||W_i||_2 (Frobenius) and the mean magnitude mean_j |W_ij| (one reading of the
  paper's "averaged per-dimension weight magnitude ||W_i||/d_i"), at the initialization and after
  the scales are applied (both are exactly alpha_i times their value at the initialization);
- sigma(g_i): for every element j, the standard deviation of the gradient g_ij across k
  minibatches (sample standard deviation, k - 1 in the denominator), averaged over the elements
  of the tensor, at the initialization and after the scales are applied;
- alongside it, the magnitude of the mean gradient, mean_j |mean_b g_bj|: Adam's step does not change
  when every gradient is multiplied by one constant, so for Adam the spread relative to the mean
  gradient (grad_std / grad_mean_abs) says more than the spread alone.

Gradient mode: ``"train"`` by default, i.e. dropout active, because the paper computes the
spread of the gradients the optimizer receives in training ("computed over the minibatches ...
with the BN in its training mode"), and those gradients carry dropout. Each minibatch gets the same
random seed before and after the scales are applied, so both sides see the same dropout masks and
the same batches: the comparison isolates the effect of the scales. ``"eval"`` turns dropout off,
as GradInit itself does (its objective is evaluated without dropout), to separate data noise from
dropout noise. In both modes normalization layers use batch statistics and no running statistic
is changed.

Pure PyTorch: the caller supplies the model, the minibatches and ``loss_fn(model, batch)`` (the
mean loss the optimizer differentiates).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import torch
from torch import nn

from .modes import gradinit_mode
from .runtime import LossFn
from .scales import apply_scales, shared_parameter_groups

MODES = ("train", "eval")


@dataclass
class ReportConfig:
    """How :func:`init_report` measures the gradient spread."""

    #: ``"train"`` (dropout on, the optimizer's gradients) or ``"eval"`` (dropout off, as GradInit).
    mode: str = "train"
    #: Seed of minibatch b is ``seed + b`` (dropout masks), identical before and after the scales.
    seed: int = 1

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")


@dataclass
class TensorStats:
    """The report's numbers for one parameter tensor (tied tensors appear once, under their first name)."""

    name: str
    shape: List[int]
    numel: int
    #: The learned scale (1.0 where the GradInit result has none, see ``scaled``).
    scale: float
    #: Whether the GradInit result names this tensor (or one of its aliases).
    scaled: bool
    norm_before: float
    norm_after: float
    mean_abs_before: float
    mean_abs_after: float
    grad_std_before: float
    grad_std_after: float
    #: mean_j |mean over minibatches of g_ij| (same minibatches and dropout masks as the std).
    grad_mean_abs_before: float
    grad_mean_abs_after: float
    aliases: List[str] = field(default_factory=list)


@dataclass
class InitReport:
    tensors: List[TensorStats]
    num_batches: int
    mode: str
    seed: int
    #: Mean loss over the k minibatches at the initialization and after the scales.
    loss_before: float
    loss_after: float
    wall_time: float

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tensors"] = [asdict(t) for t in self.tensors]
        return out


def unique_trainable(model: nn.Module) -> List[tuple]:
    """``(name, parameter, aliases)`` for every trainable tensor, once per tensor (first name)."""
    by_name = dict(model.named_parameters(remove_duplicate=False))
    return [(first, by_name[first], aliases) for first, *aliases in shared_parameter_groups(model)
            if by_name[first].requires_grad]


@contextlib.contextmanager
def report_mode(model: nn.Module, mode: str) -> Iterator[nn.Module]:
    """``eval``: GradInit's mode (no dropout, batch-statistics normalization); ``train``: the same
    with dropout on. Every flag and normalization buffer is restored on exit."""
    with gradinit_mode(model):
        if mode == "train":
            # gradinit_mode already switched normalization layers to batch statistics without
            # running-statistics updates; train() keeps that and turns dropout back on.
            model.train()
        yield model


def gradient_std(model: nn.Module, params: Sequence[torch.Tensor], batches: Sequence[Any], loss_fn: LossFn,
                 *, mode: str = "train", seed: int = 1) -> tuple:
    """sigma(g_i) for each of ``params``: per element the sample standard deviation of the gradient
    of ``loss_fn`` across ``batches``, averaged over the tensor's elements. Returns
    ``(stds, mean_abs, mean loss)`` where ``mean_abs`` is mean_j |mean_b g_bj| per tensor.
    Accumulates in float64 (Welford) so that no k gradients are held."""
    if len(batches) < 2:
        raise ValueError(f"the gradient standard deviation needs at least 2 minibatches, got {len(batches)}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    mean = [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in params]
    m2 = [torch.zeros_like(m) for m in mean]
    devices = sorted({p.device.index for p in params if p.device.type == "cuda"})
    losses = []
    with report_mode(model, mode):
        for b, batch in enumerate(batches):
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed + b)
                loss = loss_fn(model, batch)
                if not torch.isfinite(loss):
                    raise ValueError(f"minibatch {b}: the loss is {loss.item()}")
                grads = torch.autograd.grad(loss, list(params), allow_unused=True)
            losses.append(float(loss.detach()))
            n = b + 1
            with torch.no_grad():
                for g, mu, s in zip(grads, mean, m2):
                    g = torch.zeros_like(mu) if g is None else g.to(torch.float64)
                    delta = g - mu
                    mu.add_(delta / n)
                    s.addcmul_(delta, g - mu)
    k = len(batches)
    stds = [float((s / (k - 1)).clamp_min_(0).sqrt_().mean()) for s in m2]
    mean_abs = [float(mu.abs().mean()) for mu in mean]
    return stds, mean_abs, sum(losses) / k


def _norms(params: Sequence[torch.Tensor]) -> tuple:
    with torch.no_grad():
        norms = [float(torch.linalg.vector_norm(p.detach().to(torch.float64))) for p in params]
        mean_abs = [float(p.detach().to(torch.float64).abs().mean()) if p.numel() else 0.0 for p in params]
    return norms, mean_abs


def init_report(model: nn.Module, scales: Mapping[str, float], batches: Sequence[Any], loss_fn: LossFn,
                config: Optional[ReportConfig] = None) -> InitReport:
    """Measure every trainable tensor of ``model`` (at its initialization) before and after
    ``scales`` (a GradInit result's ``scales``) are applied. The model's weights, flags and
    buffers are left as they were."""
    config = config or ReportConfig()
    start = time.time()
    entries = unique_trainable(model)
    if not entries:
        raise ValueError("the model has no trainable parameter")
    names = [n for n, _, _ in entries]
    params = [p for _, p, _ in entries]
    by_alias = {a: n for n, _, aliases in entries for a in [n, *aliases]}
    # 0-d buffers with a scale (GradInitConfig.fixed_params turned back into buffers, e.g. the per-use
    # multipliers of tied embeddings): applied with the weights, not reported as tensors
    buffers = dict(model.named_buffers())
    multipliers = {k: float(v) for k, v in scales.items()
                   if k not in by_alias and k in buffers and buffers[k].dim() == 0}
    unknown = [k for k in scales if k not in by_alias and k not in multipliers]
    if unknown:
        raise ValueError(f"the scales name tensors this model does not have (or that are frozen): {unknown[:5]}"
                         f"{' ...' if len(unknown) > 5 else ''}; rebuild the model with the architecture and "
                         "arguments GradInit ran on")
    scale_of: Dict[str, float] = {}
    for key, value in scales.items():
        if key in multipliers:
            continue
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"scale of {key!r} is not finite: {value}")
        scale_of[by_alias[key]] = value

    norm0, abs0 = _norms(params)
    std0, gabs0, loss0 = gradient_std(model, params, batches, loss_fn, mode=config.mode, seed=config.seed)
    saved = [p.detach().clone() for p in params]
    saved_multipliers = {k: buffers[k].detach().clone() for k in multipliers}
    try:
        apply_scales(model, {n: scale_of[n] for n in names if n in scale_of})
        with torch.no_grad():
            for k, v in multipliers.items():
                buffers[k].mul_(v)
        norm1, abs1 = _norms(params)
        std1, gabs1, loss1 = gradient_std(model, params, batches, loss_fn, mode=config.mode, seed=config.seed)
    finally:
        with torch.no_grad():
            for p, w in zip(params, saved):
                p.copy_(w)
            for k, w in saved_multipliers.items():
                buffers[k].copy_(w)
    tensors = [
        TensorStats(name=n, shape=list(p.shape), numel=p.numel(), scale=scale_of.get(n, 1.0),
                    scaled=n in scale_of, norm_before=norm0[i], norm_after=norm1[i], mean_abs_before=abs0[i],
                    mean_abs_after=abs1[i], grad_std_before=std0[i], grad_std_after=std1[i],
                    grad_mean_abs_before=gabs0[i], grad_mean_abs_after=gabs1[i], aliases=list(al))
        for i, (n, p, al) in enumerate(entries)
    ]
    return InitReport(tensors=tensors, num_batches=len(batches), mode=config.mode, seed=config.seed,
                      loss_before=loss0, loss_after=loss1, wall_time=time.time() - start)
