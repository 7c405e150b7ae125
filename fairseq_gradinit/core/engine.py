"""The GradInit engine (Zhu et al., 2021, Algorithm 1).

Every selected parameter tensor is written as theta_i = alpha_i * W_i with W_i fixed. Since
dL/dalpha_i = <dL/dtheta_i, W_i>, the engine works on the model's own parameters: it writes
alpha*W (or alpha*W - eta*A[g]) into them in place, takes gradients with respect to them with
``torch.autograd.grad`` (``.grad`` is never touched) and reduces them to one number per tensor.

One iteration is the function :func:`gradinit_step` on a :class:`ScaledModel` (model, loss, scaled
tensors) and a :class:`GradInitState` (scales, their Adam moments, gamma); :class:`GradInit` holds
both and keeps the history, skip counting and logging around it, and :func:`gradinit` drives it.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .batching import BatchPair, authors_pairs, cycle_iterable, overlapping_pairs
from .config import GradInitConfig
from .distributed import DataParallelGroup
from .errors import OptionNamer, keyword_name
from .health import scale_verdict
from .heap import heap_kept
from .modes import gradinit_mode, math_attention, unwrap_model
from .optim import ScaleAdam
from .precision import loss_in_precision, phase_precision
from .progress import format_duration, no_objective_advice
from .random_state import capture_random_state, random_state_problem, restore_random_state
from .runtime import LossFn, check_inputs, check_loss, gradients, resolve_config, run_iterations
from .scales import FlatViews, ScaledParameters
from .second_order import SecondOrderGraph, gradient_with_graph, hessian_vector_dots
from .state_check import state_values_problem
from .uses import UnsteppedUses

logger = logging.getLogger(__name__)

@dataclass
class IterationRecord:
    """What happened in one GradInit iteration."""

    iteration: int
    #: "objective", "constraint", "ceiling" (``loss_ceiling``: a step down L(S)) or "skipped".
    branch: str
    #: L(S; alpha W), averaged over ranks.
    loss_s: Optional[float]
    #: ||g||_p of the (rank-averaged) gradient on S.
    grad_norm: Optional[float]
    #: L(S~; alpha W - eta A[g]) (objective iterations only).
    loss_s_tilde: Optional[float] = None
    #: Why the iteration was skipped.
    reason: Optional[str] = None


@dataclass
class GradInitResult:
    """Outcome of :func:`gradinit`."""

    #: Learned scale of every scaled tensor, by parameter name (first name of a shared tensor).
    scales: Dict[str, float]
    config: GradInitConfig
    history: List[IterationRecord]
    #: Seconds spent in :func:`gradinit`.
    wall_time: float
    #: Names that share a tensor with a key of ``scales`` (tied parameters).
    aliases: Dict[str, List[str]] = field(default_factory=dict)
    world_size: int = 1
    #: The health check of the scales (:class:`~.health.ScaleHealth`): :func:`gradinit` judges the scales and
    #: the phase (``health.verdict``, ``health.reasons``); the vision API replaces it by its check on a batch,
    #: which also measures the LayerNorm gains and the blocks, and the fairseq plugin stores its own in
    #: gradinit.json.
    health: Optional[Any] = None
    #: The gamma the run used (measured on the first batch with ``config.gamma_init_factor``).
    gamma: Optional[float] = None
    #: With ``config.loss_ceiling``: L(S) of the first finite iteration, the reference of the bound.
    loss_ref: Optional[float] = None

    @property
    def num_skipped(self) -> int:
        return sum(r.branch == "skipped" for r in self.history)

    @property
    def num_constraint(self) -> int:
        return sum(r.branch == "constraint" for r in self.history)

    @property
    def num_objective(self) -> int:
        return sum(r.branch == "objective" for r in self.history)

    @property
    def num_ceiling(self) -> int:
        return sum(r.branch == "ceiling" for r in self.history)

    def to_dict(self) -> dict:
        config = {("tau" if k == "lr" else k): v for k, v in self.config.to_dict().items()}
        return {
            "scales": dict(self.scales),
            "aliases": {k: list(v) for k, v in self.aliases.items()},
            # ``lr`` is written ``tau`` (the scales' learning rate), not to be taken for the training lr
            "config": config if self.gamma is None else {**config, "resolved_gamma": self.gamma},
            "gamma": self.gamma if self.gamma is not None else self.config.resolved_gamma,
            "history": [dataclasses.asdict(r) for r in self.history],
            "wall_time": self.wall_time,
            "world_size": self.world_size,
            "iterations": len(self.history),
            "num_objective": self.num_objective,
            "num_constraint": self.num_constraint,
            "num_skipped": self.num_skipped,
            # only where the bound exists: gradinit.json of runs without it keeps its keys
            **({"num_ceiling": self.num_ceiling, "loss_ref": self.loss_ref}
               if self.config.loss_ceiling is not None else {}),
            **({"health": self.health.to_dict()} if self.health is not None else {}),
        }


def foreach_norm(tensors: Sequence[torch.Tensor], p: int) -> torch.Tensor:
    """The p-norm of every tensor, accumulated in at least float32, stacked as float32 (float64
    if any tensor is float64)."""
    dtypes = {t.dtype for t in tensors}
    if dtypes <= {torch.float32, torch.float64}:
        return torch.stack(torch._foreach_norm(tensors, p)).to(max(dtypes, key=lambda d: d.itemsize))
    if torch.float64 not in dtypes:
        try:  # fp16/bf16 norms overflow or round badly unless accumulated and returned in fp32
            return torch.stack(torch._foreach_norm(tensors, p, dtype=torch.float32))
        except TypeError:  # torch without the dtype argument
            pass
    return torch.stack([torch.linalg.vector_norm(t, p, dtype=torch.promote_types(t.dtype, torch.float32))
                        for t in tensors]).float()


def _sq_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum_i ||t_i||^2 in float64 (one reduction over the buffer of :class:`FlatViews`)."""
    flat = getattr(tensors, "flat", None)
    if flat is not None:
        return torch.linalg.vector_norm(flat, dtype=torch.float64).square()
    try:
        return torch.stack(torch._foreach_norm(list(tensors), 2, dtype=torch.float64)).square().sum()
    except (TypeError, RuntimeError):  # torch without the dtype argument
        return torch.stack([t.pow(2).sum(dtype=torch.float64) for t in tensors]).sum()


@dataclass(frozen=True)
class ScaledModel:
    """What a GradInit step differentiates: the model, its loss and its scaled tensors, built once
    per run (:class:`GradInit` builds it from a :class:`GradInitConfig`)."""

    #: The unwrapped model; a step writes alpha*W (or alpha*W - eta*A) into its parameters in place.
    model: nn.Module
    #: ``loss_fn(model, batch)`` in the phase's precision (:func:`~.precision.loss_in_precision`).
    loss_fn: LossFn
    #: The tensors W_i, their gradients' flat buffer and the scales' bounds.
    scaled: ScaledParameters
    #: Uses of tied tensors that keep alpha*W in the simulated step (``config.unstepped_uses``).
    unstepped: Optional[UnsteppedUses] = None


@dataclass
class GradInitState:
    """What one step reads and updates: device tensors, except ``gamma`` and ``last_branch``."""

    #: The scales; the weights are written from this tensor (``ScaledParameters.alpha``), so a step
    #: updates it in place.
    alpha: torch.Tensor
    #: Adam on the scales for objective steps.
    adam: ScaleAdam
    #: Adam for constraint steps: ``adam`` itself with ``adam_state="shared"``, its own moments with
    #: "per_branch", so that a constraint step after a run of objective steps is not damped by their
    #: second moments (or pushed by their momentum), and vice versa.
    adam_constraint: ScaleAdam
    #: The bound on ||g||; None until the first finite step measures it (``gamma_init_factor``).
    gamma: Optional[float]
    #: The last step's branch ("" before the first).
    last_branch: str = ""
    #: With ``loss_ceiling``: L(S) of the first finite iteration, against which the bound is measured.
    loss_ref: Optional[float] = None
    #: L(S~) and the ``ok`` flag of the last scale update, left on the device: the next step reads
    #: them with its own host sync (None: nothing waits).
    pending: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    @classmethod
    def initial(cls, scaled: ScaledParameters, config: GradInitConfig) -> "GradInitState":
        """The state before the first step: the scales of ``scaled``, fresh moments, ``config``'s gamma."""
        bounds = dict(min_scale=scaled.min_scales, max_scale=scaled.max_scales)
        adam = ScaleAdam(scaled.alpha, config, **bounds)
        constraint = ScaleAdam(scaled.alpha, config, **bounds) if config.adam_state == "per_branch" else adam
        return cls(alpha=scaled.alpha, adam=adam, adam_constraint=constraint, gamma=config.resolved_gamma)


@dataclass(frozen=True)
class StepResult:
    """The host values of one step, all read in its one host sync."""

    #: "objective", "constraint", "ceiling", or "skipped" (a non-finite loss or gradient on S: nothing stepped).
    branch: str
    #: L(S; alpha W), averaged over ranks.
    loss_s: float
    #: ||g||_p of the rank-averaged gradient on S.
    grad_norm: float
    #: The previous step's (L(S~), ok) (None: no step was pending); its scale update was not
    #: applied where ok < 0.5 (a non-finite loss or scale gradient).
    previous: Optional[Tuple[float, float]] = None


def gradinit_step(model: ScaledModel, state: GradInitState, pair: BatchPair, config: GradInitConfig, *,
                  group: Optional[DataParallelGroup] = None) -> StepResult:
    """One iteration of Algorithm 1 on the pair (S, S~), in ``config.precision``.

    The math of an iteration and nothing else: :class:`GradInit` keeps the history, the count of
    skipped iterations, warnings and logging around it, as ``torch.optim.Adam`` keeps its bookkeeping
    around ``_multi_tensor_adam``. Like those functional steps it updates ``state`` in place (the
    scales, their Adam moments, gamma once measured, the branch and the pending device statistics)
    and writes into the model's parameters; it returns the host values it read.

    ``group`` is the data-parallel group as data (:class:`~.distributed.DataParallelGroup`: the
    process group, its size and rank 0), not a callback: gradients, losses and scale gradients are
    averaged over it and the new scales broadcast from its rank 0; default: as ``gradinit``'s
    ``process_group=None``, the world group where ``torch.distributed`` is initialized, else this
    process alone. Each rank passes its own shard's pair.
    """
    group = DataParallelGroup() if group is None else group
    scaled, alpha = model.scaled, state.alpha
    s, s_tilde = pair
    with phase_precision(config.precision):
        scaled.write(alpha)
        fd = config.constraint_grad == "finite_difference"
        grads, g_all, g_local, loss_s, gnorm = _first_pass(model, state, s, config, group, fd)
        finite = torch.isfinite(loss_s[0]) & torch.isfinite(gnorm)
        # The only host sync of the iteration: the branch depends on it. It also collects the
        # previous iteration's deferred S~ statistics.
        head = [loss_s[0], gnorm, finite.float()]
        if state.pending is not None:
            head += [state.pending[0], state.pending[1].float()]
        values = torch.stack(head).tolist()
        previous = tuple(values[3:5]) if state.pending is not None else None
        state.pending = None
        loss_v, gnorm_v, finite_v = values[:3]
        if finite_v < 0.5:
            state.last_branch = "skipped"
            return StepResult("skipped", loss_v, gnorm_v, previous)

        if state.gamma is None:  # gamma_init_factor: no scale has moved yet (skipped iterations do not step)
            state.gamma = config.gamma_init_factor * gnorm_v
        if config.loss_ceiling is not None and state.loss_ref is None:  # as gamma: before any scale moved
            state.loss_ref = loss_v
        if gnorm_v > state.gamma:
            branch = state.last_branch = "constraint"
            if fd:
                alpha_grad = constraint_grad_fd(model, alpha, s, grads, gnorm, config, g_all)
            else:
                alpha_grad = constraint_grad(model, alpha, s, grads, gnorm, config, g_local)
            del grads, g_local, g_all
            group.mean_([alpha_grad])
            ok = torch.ones((), dtype=torch.bool, device=alpha.device)
            new_alpha, ok = state.adam_constraint.step(alpha, alpha_grad, ok)
            state.pending = (torch.zeros((), dtype=alpha.dtype, device=alpha.device), ok)
        elif config.loss_ceiling is not None and loss_v > state.loss_ref + config.loss_ceiling:
            # The scales made the model worse than the bound allows: step down L(S) itself. Its gradient
            # in alpha_i is <g_i, W_i> of the gradient this pass already took (rank-averaged, so every
            # rank computes the same step); no second pass.
            branch = state.last_branch = "ceiling"
            alpha_grad = scaled.alpha_grad(g_all, consume=True)
            del grads, g_local, g_all
            ok = torch.isfinite(alpha_grad).all()
            new_alpha, ok = state.adam_constraint.step(alpha, alpha_grad, ok)
            state.pending = (torch.zeros((), dtype=alpha.dtype, device=alpha.device), ok)
        else:
            branch = state.last_branch = "objective"
            del g_local, g_all
            if config.lookahead_steps > 1:
                direction = _lookahead_direction(model, alpha, s, grads, config, group)
            else:
                direction = step_direction(grads, gnorm, config, state.gamma)
            alpha_grad, loss_t = objective_grad(model, alpha, s_tilde, direction, config)
            del direction, grads
            loss_t = loss_t.reshape(1)
            group.mean_([alpha_grad, loss_t])
            ok = torch.isfinite(loss_t[0])
            new_alpha, ok = state.adam.step(alpha, alpha_grad, ok)
            state.pending = (loss_t[0], ok)
        group.broadcast_([new_alpha])
        alpha.copy_(new_alpha)
    return StepResult(branch, loss_v, gnorm_v, previous)


def _first_pass(model: ScaledModel, state: GradInitState, s, config: GradInitConfig, group: DataParallelGroup,
                fd: bool):
    """The gradient on S, rank-averaged: (g of every tensor, g without the fixed ones, this rank's
    gradients with their second-order graph or None, L(S), ||g||_p)."""
    scaled, alpha, params = model.scaled, state.alpha, model.scaled.params
    # Constraint iterations come in runs (the norm comes down over many steps): after one,
    # build the second-order graph of S in this first pass already, so that a constraint
    # iteration costs one pass over S instead of two. A wrong guess costs only the graph's
    # memory, released before the objective pass over S~.
    speculate = config.reuse_graph and state.last_branch == "constraint" and not fd
    g_local = None
    if speculate:
        with math_attention():
            loss, g_local = gradient_with_graph(model.model, model.loss_fn, s, params, scaled.learned_positive)
        grads = [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, g_local.grads)]
    else:
        loss = check_loss(model.loss_fn(model.model, s))
        grads = gradients(loss, params)
    # From here on g is one zero-padded buffer (a copy, also of the graph's gradients): the
    # norm, A[g], the step and the all-reduce are a few kernels each, not one per tensor.
    grads = scaled.gather(grads)
    loss_s = loss.detach().to(alpha.dtype).reshape(1)
    del loss
    group.mean_([grads.flat] if isinstance(grads, FlatViews) else grads)
    group.mean_([loss_s])
    g_all, grads = grads, scaled.without_fixed(grads)
    return grads, g_all, g_local, loss_s, grad_norm(grads, config.norm_p)


# -- the two branches (the math of gradinit_step; public so that each piece can be checked alone) ------
def grad_norm(grads: Sequence[torch.Tensor], norm_p: int) -> torch.Tensor:
    """||g||_p over all tensors of ``grads`` (p = 1 or 2)."""
    norms = foreach_norm(grads, norm_p)
    return norms.sum() if norm_p == 1 else norms.pow(2).sum().sqrt()


def step_direction(grads: List[torch.Tensor], gnorm: torch.Tensor, config: GradInitConfig,
                    gamma: Optional[float]) -> List[torch.Tensor]:
    """A[g], computed in place in ``grads`` (one kernel where they are :class:`FlatViews`)."""
    flat = getattr(grads, "flat", None)
    if config.optimizer == "adam":
        flat.sign_() if flat is not None else torch._foreach_sign_(grads)
        return grads
    if config.sgd_step == "normalized":
        factor = (gamma / gnorm.clamp(min=1e-12)).to(grads[0].dtype)
        flat.mul_(factor) if flat is not None else torch._foreach_mul_(grads, factor)
    return grads


def _norm_grad(scaled: ScaledParameters, gbar: List[torch.Tensor], gnorm: torch.Tensor,
               norm_p: int) -> List[torch.Tensor]:
    """v = d||gbar||_p / d gbar."""
    flat = getattr(gbar, "flat", None)
    if flat is not None:
        if norm_p == 1:
            return scaled.views(flat.sign())
        return scaled.views(flat * (1.0 / gnorm.clamp(min=1e-12)).to(flat.dtype))
    if norm_p == 1:
        return list(torch._foreach_sign(gbar))
    inv = 1.0 / gnorm.clamp(min=1e-12)
    return list(torch._foreach_mul(gbar, inv.to(gbar[0].dtype)))


def constraint_grad(model: ScaledModel, alpha: torch.Tensor, s, gbar: List[torch.Tensor], gnorm: torch.Tensor,
                     config: GradInitConfig, g_local: Optional[SecondOrderGraph] = None) -> torch.Tensor:
    """d||gbar||_p/d alpha by double backward through ``g_local``, this rank's gradient on S with
    its graph (computed here by a second-order pass on S when not given)."""
    scaled = model.scaled
    v = _norm_grad(scaled, gbar, gnorm, config.norm_p)
    params = scaled.params
    # ||mean_r g_r|| has gradient mean_r <v, dg_r/dalpha>: each rank differentiates <v, g_r>, as
    # one vector-Jacobian product (no per-tensor products); tensors used only by linear operators
    # get <(Hv)_i, theta_i> from the adjoints of their uses instead of the full (Hv)_i.
    with math_attention():
        if g_local is None:
            _, g_local = gradient_with_graph(model.model, model.loss_fn, s, params, scaled.learned_positive)
        hv, dots = hessian_vector_dots(g_local, params, v, scaled.learned, alpha.dtype)
        if hv is None:  # an adjoint the recorded uses need was not computed: the full products
            del g_local
            _, g_local = gradient_with_graph(model.model, model.loss_fn, s, params, [False] * len(params))
            hv, dots = hessian_vector_dots(g_local, params, v, scaled.learned, alpha.dtype)
    del g_local, v
    h = scaled.gather(hv)
    del hv
    # a covered alpha_i is above its floor > 0; the others' dots are 0
    return scaled.alpha_grad(h, consume=True) + dots / alpha.clamp(min=torch.finfo(alpha.dtype).tiny)


def constraint_grad_fd(model: ScaledModel, alpha: torch.Tensor, s, gbar: List[torch.Tensor],
                        gnorm: torch.Tensor, config: GradInitConfig,
                        g_all: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
    """d||gbar||_p / d alpha = <H v, W_i> with H v from a forward difference of the gradient on
    S. Each rank returns (<g_r(theta + eps v), W_i> - <g_all, W_i>) / eps; their mean is the
    difference quotient of the averaged gradient. ``g_all`` is gbar with the fixed tensors'
    gradients too (their scales also move gbar; default: gbar)."""
    scaled = model.scaled
    # float64 products: the difference of the two is ~eps times smaller than either.
    base = scaled.alpha_grad(gbar if g_all is None else g_all, torch.float64)
    v = _norm_grad(scaled, gbar, gnorm, config.norm_p)
    params = scaled.params
    with torch.no_grad():
        eps = config.fd_eps * _sq_norm(params).sqrt() / _sq_norm(v).sqrt().clamp(min=1e-30)
    scaled.write(alpha, direction=v, eta=-eps.to(params[0].dtype))
    del v
    loss = check_loss(model.loss_fn(model.model, s))
    h = scaled.gather(gradients(loss, params))
    del loss
    return ((scaled.alpha_grad(h, torch.float64, consume=True) - base) / eps).to(alpha.dtype)


def _lookahead_direction(model: ScaledModel, alpha: torch.Tensor, s, grads: List[torch.Tensor],
                         config: GradInitConfig, group: DataParallelGroup) -> List[torch.Tensor]:
    """The sum u_1 + ... + u_K of K simulated Adam updates from alpha W (``lookahead_steps``),
    Adam's bias-corrected m_t / (sqrt(v_t) + 1e-8): u_1 from g (sign g up to eps / |g|), each later
    u_t from the gradient on S at alpha W - eta (u_1 + ... + u_{t-1}), averaged over ranks as g.
    The u_t are constants of the objective, as A[g] is: its derivative in alpha_i stays
    <dL/dtheta_i, W_i>."""
    scaled = model.scaled
    b1, b2 = config.lookahead_betas
    m = [torch.zeros_like(g) for g in grads]
    v = [torch.zeros_like(g) for g in grads]
    total = [torch.zeros_like(g) for g in grads]
    g = grads
    for t in range(1, config.lookahead_steps + 1):
        if t > 1:
            scaled.write(alpha, direction=total, eta=config.eta)
            loss = check_loss(model.loss_fn(model.model, s))
            g = scaled.gather(gradients(loss, scaled.params))
            del loss
            group.mean_([g.flat] if isinstance(g, FlatViews) else g)
            g = scaled.without_fixed(g)
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=1.0 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1.0 - b2)
        denom = torch._foreach_add(torch._foreach_sqrt(torch._foreach_div(v, 1.0 - b2 ** t)), 1e-8)
        torch._foreach_add_(total, torch._foreach_div(torch._foreach_div(m, 1.0 - b1 ** t), denom))
        del denom
    return total


def objective_grad(model: ScaledModel, alpha: torch.Tensor, s_tilde, direction: List[torch.Tensor],
                    config: GradInitConfig):
    """d L(S~; alpha W - eta A) / d alpha / eta with A held constant, and the loss."""
    scaled, unstepped = model.scaled, model.unstepped
    if unstepped is None:
        scaled.write(alpha, direction=direction, eta=config.eta)
        loss = check_loss(model.loss_fn(model.model, s_tilde))
        h = scaled.gather(gradients(loss, scaled.params))  # the autograd tensors go at once
        return scaled.alpha_grad(h, consume=True) / config.eta, loss.detach().to(alpha.dtype)
    unstepped.drop_steps(direction)
    scaled.write(alpha, direction=direction, eta=config.eta)
    unstepped_weights = {i: scaled.W[i] * alpha[i].to(scaled.W[i].dtype) for i, _, _ in unstepped.partial}
    params = scaled.params
    with unstepped.untied(unstepped_weights) as leaves:
        loss = check_loss(model.loss_fn(model.model, s_tilde))
        h = gradients(loss, list(params) + [leaf for _, leaf in leaves])
    for k, (i, _) in enumerate(leaves):
        h[i] = h[i] + h[len(params) + k]  # both uses depend on alpha_i through W_i
    return scaled.alpha_grad(h[:len(params)]) / config.eta, loss.detach().to(alpha.dtype)


class GradInit:
    """A GradInit run: :func:`gradinit_step` over ``target`` (a :class:`ScaledModel`) and ``state`` (a
    :class:`GradInitState`), with the history, skip counting, warnings and progress lines around it;
    :func:`gradinit` is the usual entry point."""

    # Fixed attributes: an assignment to a name the class does not hold (``engine.gamma = ...`` for
    # ``engine.state.gamma``) raises instead of adding an attribute that nothing reads.
    __slots__ = ("cfg", "dist", "target", "state", "history", "_waiting", "_consecutive_skips")

    def __init__(self, model: nn.Module, loss_fn: LossFn, config: GradInitConfig, *,
                 process_group=None):
        model = unwrap_model(model)
        self.cfg = config
        self.dist = DataParallelGroup(process_group)
        scaled = ScaledParameters(
            model, config.param_filter, include_unscaled=config.step_params == "all",
            bounds=config.scale_bounds, min_scale=config.min_scale, max_scale=config.max_scale,
            fixed=config.fixed_params)
        if self.dist.active:
            # Every rank must start from rank 0's weights (fairseq's legacy_ddp does not broadcast),
            # also those without a scale, so that all ranks end identical.
            with torch.no_grad():
                self.dist.broadcast_(list(model.parameters()))
        if config.max_step_ratio is not None:
            raised = scaled.raise_floors_for_step_ratio(config.eta, config.max_step_ratio)
            logger.info("gradinit: max_step_ratio %g raised the lower bound of %d scales (eta / (ratio * rms W))",
                        config.max_step_ratio, len(raised))
        scaled.capture()
        unstepped = (UnsteppedUses(model, scaled.params, config.unstepped_uses)
                     if config.unstepped_uses else None)
        if unstepped is not None:
            logger.info("gradinit: uses that keep alpha*W in the simulated step: %s", ", ".join(unstepped.names))
        self.target = ScaledModel(model, loss_in_precision(loss_fn, config.precision, scaled.params[0].device.type),
                                  scaled, unstepped)
        self.state = GradInitState.initial(scaled, config)
        self.history: List[IterationRecord] = []
        self._waiting: Optional[IterationRecord] = None  # the record whose S~ statistics are pending
        self._consecutive_skips = 0

    # -- bookkeeping ----------------------------------------------------------------------
    def _flush_pending(self, values: Optional[Sequence[float]] = None) -> None:
        """Complete the waiting record with its S~ statistics: ``values`` read with another host read
        (the step's or a progress line's), else read here."""
        rec = self._waiting
        if rec is None:
            return
        if values is None:
            loss_t, ok = self.state.pending
            values = torch.stack([loss_t, ok.float()]).tolist()
            self.state.pending = None
        self._waiting = None
        loss_v, ok_v = values
        if rec.branch == "objective":
            rec.loss_s_tilde = loss_v
        if ok_v < 0.5:
            rec.branch = "skipped"
            rec.reason = "non-finite loss or scale gradient in the scale update"
            self._skip(rec)
        else:
            self._consecutive_skips = 0

    def _skip(self, rec: IterationRecord) -> None:
        self._consecutive_skips += 1
        warnings.warn(f"GradInit iteration {rec.iteration}: {rec.reason}; scales left unchanged",
                      RuntimeWarning, stacklevel=3)
        if self._consecutive_skips >= self.cfg.max_consecutive_skips:
            raise FloatingPointError(
                f"GradInit: {self._consecutive_skips} consecutive iterations had a non-finite loss or "
                "gradient; the model or data produce NaN/Inf at these scales. Check the inputs, lower "
                "GradInitConfig.lr or eta, or set max_scale."
            )

    def log_progress(self, it: int, total: Optional[int], *, timing: str = "", settled_only: bool = False) -> None:
        """Log one progress line. It reads the device once (the scales' min/mean/max, and the pending
        S~ statistics with them unless ``settled_only``); iterations that log nothing read nothing."""
        if settled_only and not self.settled:
            return
        a, mask = self.state.alpha.detach(), self.target.scaled.scaled  # no boolean indexing: it would read the mask
        head = [torch.where(mask, a, math.inf).min(), (a * mask).sum() / mask.sum(),
                torch.where(mask, a, -math.inf).max()]
        pending = self._waiting is not None and not settled_only
        if pending:
            head += [self.state.pending[0].to(a.dtype), self.state.pending[1].to(a.dtype)]
        values = torch.stack(head).tolist()
        if pending:
            self.state.pending = None
            self._flush_pending(values[3:5])
        stats = values[:3]
        rec = self.history[self.settled - 1] if settled_only else self.history[-1]
        it = rec.iteration if settled_only else it
        tot = f"/{total}" if total else ""
        fmt = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
        logger.info(
            "gradinit iter %d%s | %s | L(S) %s | L(S~) %s | |g|_%d %s (gamma %.4g) | scale min/mean/max "
            "%.4g/%.4g/%.4g | skipped %d%s", it, tot, rec.branch, fmt(rec.loss_s), fmt(rec.loss_s_tilde),
            self.cfg.norm_p, fmt(rec.grad_norm), self.state.gamma or float("nan"), *stats,
            sum(r.branch == "skipped" for r in self.history), f" | {timing}" if timing else "",
        )

    # -- one iteration --------------------------------------------------------------------
    def step(self, pair: BatchPair) -> IterationRecord:
        """One iteration of Algorithm 1 on the pair (S, S~) (:func:`gradinit_step`), recorded."""
        measuring = self.state.gamma is None
        measuring_ref = self.cfg.loss_ceiling is not None and self.state.loss_ref is None
        out = gradinit_step(self.target, self.state, pair, self.cfg, group=self.dist)
        if out.previous is not None:
            self._flush_pending(out.previous)
        rec = IterationRecord(iteration=len(self.history) + 1, branch=out.branch, loss_s=out.loss_s,
                              grad_norm=out.grad_norm)
        self.history.append(rec)
        if rec.branch == "skipped":
            rec.reason = "non-finite loss or gradient on S"
            self._skip(rec)
            return rec
        if measuring:
            logger.info("gradinit: gamma = %g x ||g||_%d at the init (%.6g) = %.6g", self.cfg.gamma_init_factor,
                        self.cfg.norm_p, out.grad_norm, self.state.gamma)
        if measuring_ref:
            logger.info("gradinit: loss ceiling: L(S) may rise to %.6g (%.6g at the init + %g)",
                        self.state.loss_ref + self.cfg.loss_ceiling, self.state.loss_ref, self.cfg.loss_ceiling)
        self._waiting = rec
        return rec

    # -- interrupting and resuming ---------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the loop needs to continue after the last completed iteration (CPU tensors):
        the scales, the scales' Adam moments, the history and the branch state, torch's random state
        of every rank (``"rng"``: the dropout masks of the next iterations), with the names and
        squared norms of the W_i and the config, against which :meth:`load_state_dict` checks. With
        more than one rank, every rank calls it at the same iteration (the random states are gathered)."""
        self._flush_pending()
        separate = self.state.adam_constraint is not self.state.adam
        return {
            "rng": capture_random_state(self.target.scaled.params, self.dist),
            "format": 1, "names": list(self.target.scaled.names), "w_sq_norms": self._w_sq_norms(),
            "config": _result_settings(self.cfg), "alpha": self.state.alpha.detach().cpu().clone(),
            "adam": self.state.adam.state_dict(), "adam_constraint": self.state.adam_constraint.state_dict() if separate else None,
            "history": [dataclasses.asdict(r) for r in self.history],
            "consecutive_skips": self._consecutive_skips, "last_branch": self.state.last_branch, "gamma": self.state.gamma,
            **({"loss_ref": self.state.loss_ref} if self.cfg.loss_ceiling is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of an interrupted run of the same model, initial weights
        and settings (``ValueError`` naming what differs otherwise). Its random state, where it has
        one, is set again, so that the next iteration draws what it would have drawn in that run; a
        state without one (saved before the field existed) continues from the present random state."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise ValueError("not a GradInit state (expected the dict of GradInit.state_dict())")
        rng_problem = random_state_problem(state["rng"]) if state.get("rng") is not None else None
        if rng_problem:
            raise ValueError(f"the GradInit state is damaged: {rng_problem}")
        if state["names"] != list(self.target.scaled.names):
            raise ValueError("the GradInit state was saved for other tensors: e.g. "
                             f"{sorted(set(state['names']) ^ set(self.target.scaled.names))[:3]}")
        saved_w, own_w = torch.tensor(state["w_sq_norms"]), torch.tensor(self._w_sq_norms())
        if not torch.allclose(saved_w, own_w, rtol=1e-6, atol=0):
            k = int((saved_w - own_w).abs().argmax())
            raise ValueError(f"the GradInit state was saved for other initial weights ({self.target.scaled.names[k]!r} "
                             "differs): resume with the same model, seed and data, or start GradInit anew")
        own_cfg = _result_settings(self.cfg)
        diff = sorted(k for k in set(own_cfg) | set(state["config"]) if own_cfg.get(k) != state["config"].get(k))
        if diff:
            raise ValueError(f"the GradInit state was saved with other settings: {', '.join(diff)}")
        damaged = state_values_problem(state, len(self.target.scaled.names), IterationRecord,
                                       separate_constraint=self.state.adam_constraint is not self.state.adam)
        if damaged:
            raise ValueError(f"the GradInit state is damaged: {damaged}")
        with torch.no_grad():
            self.state.alpha.copy_(state["alpha"].to(self.state.alpha))
        self.state.adam.load_state_dict(state["adam"])
        if self.state.adam_constraint is not self.state.adam:
            self.state.adam_constraint.load_state_dict(state["adam_constraint"])
        self.history = [IterationRecord(**r) for r in state["history"]]
        self._waiting = self.state.pending = None
        self._consecutive_skips = int(state["consecutive_skips"])
        self.state.last_branch = str(state["last_branch"])
        if self.cfg.gamma_init_factor is not None and state.get("gamma") is not None:
            self.state.gamma = float(state["gamma"])
        if self.cfg.loss_ceiling is not None and state.get("loss_ref") is not None:
            self.state.loss_ref = float(state["loss_ref"])
        if state.get("rng") is not None:
            restore_random_state(state["rng"], self.target.scaled.params, self.dist)
        elif self.cfg.dropout:
            logger.warning("gradinit: the GradInit state holds no random state (it was saved by an older "
                           "fairseq_gradinit): with dropout on, the resumed run draws other dropout masks than an "
                           "uninterrupted one, so its scales can differ; only a state saved with the random state "
                           "resumes exactly")

    def _w_sq_norms(self) -> List[float]:
        return [float(w.detach().double().pow(2).sum()) for w in self.target.scaled.W]

    @property
    def settled(self) -> int:
        """How many records of ``history`` are final (the last one waits for its S~ statistics)."""
        return len(self.history) - (self._waiting is not None)

    def finalize(self) -> None:
        self._flush_pending()
        self.target.scaled.write(self.state.alpha)


def gradinit(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: LossFn,
    config: Optional[GradInitConfig] = None,
    *,
    process_group=None,
    callback: Optional[Callable[[IterationRecord], None]] = None,
    state: Optional[dict] = None,
    checkpoint: Optional[Callable[[dict], None]] = None,
    checkpoint_interval: int = 0,
    option_name: OptionNamer = keyword_name,
    **overrides,
) -> GradInitResult:
    """Learn one scale per parameter tensor of ``model`` with GradInit and apply it in place.

    Args:
        model: any ``nn.Module`` (DataParallel/DDP wrappers are unwrapped).
        batches: an iterable of batches, paired into (S, S~) with ``config.overlap`` by
            :func:`overlapping_pairs`, or of ready :class:`BatchPair` items used as they are.
            Re-iterable inputs (lists, DataLoaders) are cycled until ``config.iters`` iterations.
        loss_fn: ``loss_fn(model, batch)`` returning the mean loss of ``batch`` (scalar tensor).
        config: a :class:`GradInitConfig`; keyword ``overrides`` replace its fields.
        process_group: data-parallel group; defaults to the world group when
            ``torch.distributed`` is initialized. Each rank passes its own shard of the data.
        callback: called with every :class:`IterationRecord` as soon as it is complete.
        state: a :meth:`GradInit.state_dict` of an interrupted run of the same model, weights and
            settings: the run continues after its last iteration, and ``batches`` must continue
            where that run's stopped (pair number ``len(state["history"]) + 1`` first).
        checkpoint: called with :meth:`GradInit.state_dict` every ``checkpoint_interval`` iterations.
        option_name: how a warning names an option to change (default: the keyword, ``iters=...``; a
            command-line front end passes :func:`~.errors.flag_name`).

    Returns:
        A :class:`GradInitResult`, with ``health``, the verdict on the learned scales and the phase
        (:func:`~.health.scale_verdict`). The model then holds alpha_i * W_i; its train/eval flags and
        normalization buffers are as before. If an exception interrupts the run (also
        ``FloatingPointError`` when every iteration was skipped), the model holds exactly the
        weights it was given.
    """
    config = resolve_config(GradInitConfig, config, overrides)
    check_inputs(model, loss_fn)
    if config.gamma is None and config.gamma_init_factor is None:
        logger.info("gradinit: gamma not set; using the rule of thumb %s -> gamma = %.4g",
                    "eta*gamma = 0.1" if config.optimizer == "adam" else "eta*gamma^2 = 0.1",
                    config.resolved_gamma)

    start = time.perf_counter()
    inner = unwrap_model(model)
    engine = GradInit(inner, loss_fn, config, process_group=process_group)
    if state is not None:
        engine.load_state_dict(state)
        logger.info("gradinit: resuming after iteration %d", len(engine.history))
    if checkpoint_interval and checkpoint is not None:
        every = (checkpoint_interval, lambda: checkpoint(engine.state_dict()))
    elif checkpoint_interval or checkpoint is not None:
        raise ValueError("checkpoint and checkpoint_interval go together: pass both (a callable and an "
                         "interval >= 1) or neither")
    else:
        every = None
    with gradinit_mode(inner, dropout=config.dropout), heap_kept(engine.target.scaled.params[0].device):
        run_iterations(engine, engine.target.scaled, _pair_stream(batches, config), config.iters,
                       log_interval=config.log_interval, callback=callback, name="GradInit",
                       log_seconds=config.log_seconds, start=len(engine.history), every=every)
    return _finished(engine, config, time.perf_counter() - start, option_name)


def _finished(engine: GradInit, config: GradInitConfig, wall: float, option_name: OptionNamer) -> GradInitResult:
    """The result of a finished run, with its health verdict, its summary line and the warning it deserves."""
    result = GradInitResult(scales=engine.target.scaled.scales_dict(), config=config, history=engine.history,
                            wall_time=wall, aliases=engine.target.scaled.aliases, world_size=engine.dist.world_size,
                            gamma=engine.state.gamma, loss_ref=engine.state.loss_ref)
    # The health check from the scales and the phase alone, at no cost (no pass over the model): the vision API
    # and the fairseq plugin replace it by theirs, which also measure the LayerNorm gains and the blocks.
    result.health = scale_verdict(result.scales, config=config, history=result.history, gamma=engine.state.gamma)
    # The one measured time of the phase: gradinit.json's wall_time and the plugin's summary line say the same.
    ceiling = f", {result.num_ceiling} at the loss ceiling" if config.loss_ceiling is not None else ""
    logger.info("gradinit: %d iterations (%d objective, %d constraint%s, %d skipped) in %s",
                len(result.history), result.num_objective, result.num_constraint, ceiling, result.num_skipped,
                format_duration(wall))
    advice = no_objective_advice([r.branch for r in result.history], [r.grad_norm for r in result.history],
                                 engine.state.gamma, config.norm_p, option_name)
    if advice:
        logger.warning(advice)
    return result


def _result_settings(cfg: GradInitConfig) -> dict:
    """The settings that change the learned scales, as JSON-ready values (the iteration count
    left out: a resumed run may go on for longer)."""
    from .options import result_options

    d = cfg.to_dict()
    return {k: d[k] for k in result_options(type(cfg)) if k in d and k != "iters"}


def _pair_stream(batches: Iterable[Any], config: GradInitConfig) -> Iterator[BatchPair]:
    stream = cycle_iterable(batches) if config.iters is not None else iter(batches)
    try:
        first = next(stream)
    except StopIteration:
        return iter(())

    def chain():
        yield first
        yield from stream

    if isinstance(first, BatchPair):
        return chain()
    if config.pairs == "authors":
        return authors_pairs(chain())
    return overlapping_pairs(chain(), config.overlap)
