"""MetaInit (Dauphin & Schoenholz, 2019) as the GradInit paper runs it (its Appendix, "Improved
Implementation of MetaInit"): real data batches and Adam, with the same gradient clipping and
lower bound as GradInit, on one norm per weight tensor.

MetaInit minimizes the gradient quotient

    GQ(L, theta) = 1/N * sum_j | (g_j - (H g)_j) / (g_j + eps * sign(g_j)) - 1 |,

the mean relative change of the gradient g after a gradient-descent step of unit length
(g(theta - g) ~ g - H g), over all N trainable parameters, with H g = d(||g||^2 / 2)/d theta.
It learns the norm of each weight tensor: theta_i = alpha_i * W_i with W_i fixed, so
||theta_i|| = alpha_i * ||W_i|| and the same :class:`~fairseq_gradinit.core.scales.ScaledParameters`
bookkeeping as GradInit applies. The gradient of GQ with respect to alpha needs third-order
derivatives (a gradient of a Hessian-vector product), which makes MetaInit several times as
expensive as a GradInit iteration in time and memory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .batching import cycle_iterable
from .config import config_to_dict, invalid, is_positive, validate_scale_fields
from .distributed import DataParallelGroup
from .heap import heap_kept
from .modes import gradinit_mode, math_attention, unwrap_model
from .optim import ScaleAdam
from .runtime import LossFn, check_inputs, check_loss, gradients, resolve_config, run_iterations
from .scales import ScaledParameters

logger = logging.getLogger(__name__)


@dataclass
class MetaInitConfig:
    """Options of :func:`metainit`."""

    #: Learning rate of the Adam optimizer on the scales (the norm of tensor i is alpha_i ||W_i||).
    lr: float = 1e-2
    #: Adam betas (the paper uses Adam's defaults).
    betas: Tuple[float, float] = (0.9, 0.999)
    #: Adam epsilon.
    adam_eps: float = 1e-8
    #: eps of the gradient quotient's denominator g + eps * sign(g) (MetaInit uses 1e-5).
    eps: float = 1e-5
    #: Number of iterations (one batch each). ``None``: one pass over ``batches``.
    iters: Optional[int] = None
    #: Lower bound of every scale.
    min_scale: float = 0.01
    #: Optional upper bound of every scale.
    max_scale: Optional[float] = None
    #: Clip the norm of the scale gradient to this value (``None``: no clipping).
    scale_grad_clip: Optional[float] = 1.0
    #: Abort after this many consecutive iterations with a non-finite quotient or gradient.
    max_consecutive_skips: int = 10
    #: Log progress every this many iterations.
    log_interval: int = 50
    #: Also log progress every this many seconds of wall time (0: off).
    log_seconds: float = 30.0
    #: Selects which tensors get a norm to learn: ``fn(name, param) -> bool``. ``None``: every
    #: trainable tensor that is not all zeros. The quotient always covers all trainable tensors.
    param_filter: Optional[Callable[[str, nn.Parameter], bool]] = field(default=None, repr=False)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field and its allowed range."""
        if not is_positive(self.eps):
            invalid(self, "eps", "a finite number > 0 (MetaInit uses 1e-5)")
        validate_scale_fields(self, eps_field="adam_eps")

    def to_dict(self) -> dict:
        return config_to_dict(self)


@dataclass
class MetaInitRecord:
    """What happened in one MetaInit iteration."""

    iteration: int
    #: "update" or "skipped".
    branch: str
    #: Gradient quotient on the batch, before the update (rank-averaged).
    gq: Optional[float]
    #: Training loss on the batch (rank-averaged).
    loss: Optional[float]
    #: ||g||_2 of the local gradient (rank-averaged).
    grad_norm: Optional[float]
    reason: Optional[str] = None


@dataclass
class MetaInitResult:
    """Outcome of :func:`metainit`."""

    #: Learned scale alpha_i of every tensor (new norm / initial norm), by parameter name.
    scales: Dict[str, float]
    #: Learned norm alpha_i * ||W_i|| of every tensor.
    norms: Dict[str, float]
    #: Norm ||W_i|| before MetaInit.
    initial_norms: Dict[str, float]
    config: MetaInitConfig
    history: List[MetaInitRecord]
    wall_time: float
    aliases: Dict[str, List[str]] = field(default_factory=dict)
    world_size: int = 1

    @property
    def num_skipped(self) -> int:
        return sum(r.branch == "skipped" for r in self.history)

    def to_dict(self) -> dict:
        return {
            "scales": dict(self.scales),
            "norms": dict(self.norms),
            "initial_norms": dict(self.initial_norms),
            "aliases": {k: list(v) for k, v in self.aliases.items()},
            "config": self.config.to_dict(),
            "history": [dataclasses.asdict(r) for r in self.history],
            "wall_time": self.wall_time,
            "world_size": self.world_size,
            "iterations": len(self.history),
            "num_skipped": self.num_skipped,
        }


def gradient_quotient(loss: torch.Tensor, params: Sequence[torch.Tensor], eps: float = 1e-5,
                      grads: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
    """MetaInit's gradient quotient of ``loss`` over ``params``, differentiable (create_graph).

    ``grads`` may pass d loss / d params already computed with ``create_graph=True``.
    """
    if grads is None:
        grads = gradients(loss, params, create_graph=True)
    half_sq = sum((g * g).sum() for g in grads) / 2
    if not half_sq.requires_grad:  # the gradient does not depend on the parameters (linear loss)
        hv = [torch.zeros_like(p) for p in params]
    else:
        hv = gradients(half_sq, params, create_graph=True)
    total = sum(p.numel() for p in params)
    out = 0.0
    for g, h in zip(grads, hv):
        sign = torch.where(g >= 0, 1.0, -1.0).to(g.dtype).detach()
        out = out + ((g - h) / (g + eps * sign) - 1).abs().sum()
    return out / total


def _batch_norm_composite(self: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """Batch-statistics BN from elementary ops, differentiable to any order (PyTorch's fused
    batch_norm stops at second order when its input depends on the parameters)."""
    dims = [0] + list(range(2, x.dim()))
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    var = centered.pow(2).mean(dims, keepdim=True)  # biased variance, as BN uses for normalizing
    y = centered * torch.rsqrt(var + self.eps)
    shape = [1, -1] + [1] * (x.dim() - 2)
    if self.weight is not None:
        y = y * self.weight.view(shape)
    if self.bias is not None:
        y = y + self.bias.view(shape)
    return y


@contextlib.contextmanager
def higher_order_batch_norm(model: nn.Module) -> Iterator[nn.Module]:
    """Within the context, BatchNorm layers that normalize with batch statistics (as in
    :func:`~fairseq_gradinit.core.modes.gradinit_mode`) run a composite implementation that
    supports third-order derivatives. The modules are restored on exit."""
    swapped = []
    for m in model.modules():
        if isinstance(m, _BatchNorm) and m.training and not m.track_running_stats:
            swapped.append((m, m.__dict__.get("forward")))
            m.forward = types.MethodType(_batch_norm_composite, m)
    try:
        yield model
    finally:
        for m, old in swapped:
            if old is None:
                del m.forward
            else:
                m.forward = old


class MetaInit:
    """Stateful MetaInit run; :func:`metainit` is the usual entry point."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, config: MetaInitConfig, *, process_group=None):
        self.model = unwrap_model(model)
        self.loss_fn = loss_fn
        self.cfg = config
        self.dist = DataParallelGroup(process_group)
        self.scaled = ScaledParameters(self.model, config.param_filter, min_scale=config.min_scale,
                                       max_scale=config.max_scale)
        seen, self.all_params = set(), []
        for p in self.model.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self.all_params.append(p)
        if self.dist.active:
            with torch.no_grad():
                self.dist.broadcast_(self.scaled.params)
        self.scaled.capture()
        self.alpha = self.scaled.alpha
        self.initial_norms = torch.stack([w.float().norm() for w in self.scaled.W]).to(self.alpha.device)
        adam_cfg = types.SimpleNamespace(lr=config.lr, betas=config.betas, eps=config.adam_eps,
                                         scale_grad_clip=config.scale_grad_clip)
        self.adam = ScaleAdam(self.alpha, adam_cfg, min_scale=self.scaled.min_scales,
                              max_scale=self.scaled.max_scales)
        self.history: List[MetaInitRecord] = []
        self._consecutive_skips = 0

    def step(self, batch: Any) -> MetaInitRecord:
        cfg = self.cfg
        it = len(self.history) + 1
        self.scaled.write(self.alpha)
        params = self.all_params
        scaled_ids = {id(p) for p in self.scaled.params}
        with math_attention():
            loss = check_loss(self.loss_fn(self.model, batch))
            grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            # Tensors the loss does not reach take no part in the quotient.
            used = [(p, g) for p, g in zip(params, grads) if g is not None]
            if not used:
                raise ValueError("the loss returned by loss_fn depends on no trainable parameter")
            gq = gradient_quotient(loss, [p for p, _ in used], cfg.eps, grads=[g for _, g in used])
            gnorm = torch.stack([g.detach().float().pow(2).sum() for _, g in used]).sum().sqrt()
            if isinstance(gq, torch.Tensor) and gq.requires_grad and any(id(p) in scaled_ids for p, _ in used):
                h = gradients(gq, self.scaled.params)
                alpha_grad = self.scaled.alpha_grad(h)
            else:
                alpha_grad = torch.zeros_like(self.alpha)
        stats = torch.stack([gq.detach().float().reshape(()).to(self.alpha.device),
                             loss.detach().float().to(self.alpha.device), gnorm.to(self.alpha.device)])
        del loss, grads, used, gq
        self.dist.mean_([alpha_grad, stats])
        ok = torch.isfinite(stats).all()
        new_alpha, ok = self.adam.step(self.alpha, alpha_grad, ok)
        self.dist.broadcast_([new_alpha])
        self.alpha.copy_(new_alpha)
        gq_v, loss_v, gnorm_v, ok_v = torch.cat([stats, ok.float().reshape(1)]).tolist()
        rec = MetaInitRecord(iteration=it, branch="update", gq=gq_v, loss=loss_v, grad_norm=gnorm_v)
        self.history.append(rec)
        if ok_v < 0.5:
            rec.branch, rec.reason = "skipped", "non-finite quotient, loss or scale gradient"
            self._consecutive_skips += 1
            warnings.warn(f"MetaInit iteration {it}: {rec.reason}; scales left unchanged", RuntimeWarning,
                          stacklevel=3)
            if self._consecutive_skips >= cfg.max_consecutive_skips:
                raise FloatingPointError(
                    f"MetaInit: {self._consecutive_skips} consecutive iterations had a non-finite gradient "
                    "quotient or gradient; check the inputs, or lower MetaInitConfig.lr")
        else:
            self._consecutive_skips = 0
        return rec

    @property
    def settled(self) -> int:
        return len(self.history)

    def finalize(self) -> None:
        self.scaled.write(self.alpha)

    def log_progress(self, it: int, total: Optional[int], *, timing: str = "", settled_only: bool = False) -> None:
        rec = self.history[-1]
        a = self.alpha.detach()
        stats = torch.stack([a.min(), a.mean(), a.max()]).tolist()
        fmt = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
        logger.info("metainit iter %d%s | GQ %s | loss %s | |g|_2 %s | scale min/mean/max %.4g/%.4g/%.4g | "
                    "skipped %d%s", it, f"/{total}" if total else "", fmt(rec.gq), fmt(rec.loss),
                    fmt(rec.grad_norm), *stats, sum(r.branch == "skipped" for r in self.history),
                    f" | {timing}" if timing else "")

    def result(self, wall: float) -> MetaInitResult:
        scales = self.alpha.detach().float()
        norms = (scales * self.initial_norms).cpu().tolist()
        return MetaInitResult(
            scales=self.scaled.scales_dict(),
            norms=dict(zip(self.scaled.names, norms)),
            initial_norms=dict(zip(self.scaled.names, self.initial_norms.cpu().tolist())),
            config=self.cfg, history=self.history, wall_time=wall, aliases=self.scaled.aliases,
            world_size=self.dist.world_size,
        )


def metainit(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: LossFn,
    config: Optional[MetaInitConfig] = None,
    *,
    process_group=None,
    callback: Optional[Callable[[MetaInitRecord], None]] = None,
    **overrides,
) -> MetaInitResult:
    """Learn the norm of every selected weight tensor of ``model`` with MetaInit, in place.

    Args:
        model: any ``nn.Module`` (DataParallel/DDP wrappers are unwrapped). Normalization layers
            use batch statistics and their running buffers are left untouched, as in GradInit.
        batches: an iterable of batches (one per iteration). Re-iterable inputs are cycled until
            ``config.iters`` iterations; with ``iters=None`` one pass is made.
        loss_fn: ``loss_fn(model, batch)`` returning the mean loss of ``batch``.
        config: a :class:`MetaInitConfig`; keyword ``overrides`` replace its fields.
        process_group: data-parallel group (default: the world group when initialized).
        callback: called with every :class:`MetaInitRecord`.

    Returns:
        A :class:`MetaInitResult`; the model then holds alpha_i * W_i.
    """
    config = resolve_config(MetaInitConfig, config, overrides)
    check_inputs(model, loss_fn)
    start = time.perf_counter()
    inner = unwrap_model(model)
    engine = MetaInit(inner, loss_fn, config, process_group=process_group)
    stream = cycle_iterable(batches) if config.iters is not None else iter(batches)
    with gradinit_mode(inner), higher_order_batch_norm(inner), heap_kept(engine.scaled.params[0].device):
        run_iterations(engine, engine.scaled, stream, config.iters, log_interval=config.log_interval,
                       callback=callback, name="MetaInit", log_seconds=config.log_seconds)
    wall = time.perf_counter() - start
    result = engine.result(wall)
    logger.info("metainit: %d iterations (%d skipped) in %.1fs", len(result.history), result.num_skipped, wall)
    return result
