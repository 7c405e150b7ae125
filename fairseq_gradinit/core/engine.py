"""The GradInit engine (Zhu et al., 2021, Algorithm 1).

Every selected parameter tensor is written as theta_i = alpha_i * W_i with W_i fixed. Since
dL/dalpha_i = <dL/dtheta_i, W_i>, the engine works on the model's own parameters: it writes
alpha*W (or alpha*W - eta*A[g]) into them in place, takes gradients with respect to them with
``torch.autograd.grad`` (``.grad`` is never touched) and reduces them to one number per tensor.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import torch
from torch import nn

from .batching import BatchPair, authors_pairs, cycle_iterable, overlapping_pairs
from .config import GradInitConfig
from .modes import gradinit_mode, math_attention, unwrap_model
from .distributed import DataParallelGroup
from .optim import ScaleAdam
from .precision import loss_in_precision, phase_precision
from .progress import format_duration, no_objective_advice
from .runtime import LossFn, check_inputs, check_loss, gradients, resolve_config, run_iterations
from .scales import FlatViews, ScaledParameters
from .uses import UnsteppedUses

logger = logging.getLogger(__name__)

@dataclass
class IterationRecord:
    """What happened in one GradInit iteration."""

    iteration: int
    #: "objective", "constraint" or "skipped".
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
    #: The health check of the scales (:class:`~.health.ScaleHealth`) where the caller ran it (the
    #: vision API does; the fairseq plugin stores it in gradinit.json).
    health: Optional[Any] = None
    #: The gamma the run used (measured on the first batch with ``config.gamma_init_factor``).
    gamma: Optional[float] = None

    @property
    def num_skipped(self) -> int:
        return sum(r.branch == "skipped" for r in self.history)

    @property
    def num_constraint(self) -> int:
        return sum(r.branch == "constraint" for r in self.history)

    @property
    def num_objective(self) -> int:
        return sum(r.branch == "objective" for r in self.history)

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


class GradInit:
    """Stateful GradInit run; :func:`gradinit` is the usual entry point."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, config: GradInitConfig, *,
                 process_group=None):
        self.model = unwrap_model(model)
        self.loss_fn = loss_fn
        self.cfg = config
        self.gamma = config.resolved_gamma  # None until the first batch measures it (gamma_init_factor)
        self.dist = DataParallelGroup(process_group)
        self.scaled = ScaledParameters(
            self.model, config.param_filter, include_unscaled=config.step_params == "all",
            bounds=config.scale_bounds, min_scale=config.min_scale, max_scale=config.max_scale,
            fixed=config.fixed_params)
        if self.dist.active:
            # Every rank must start from rank 0's weights (fairseq's legacy_ddp does not broadcast),
            # also those without a scale, so that all ranks end identical.
            with torch.no_grad():
                self.dist.broadcast_(list(self.model.parameters()))
        if config.max_step_ratio is not None:
            raised = self.scaled.raise_floors_for_step_ratio(config.eta, config.max_step_ratio)
            logger.info("gradinit: max_step_ratio %g raised the lower bound of %d scales (eta / (ratio * rms W))",
                        config.max_step_ratio, len(raised))
        self.scaled.capture()
        self.alpha = self.scaled.alpha
        self.unstepped = (UnsteppedUses(self.model, self.scaled.params, config.unstepped_uses)
                          if config.unstepped_uses else None)
        if self.unstepped is not None:
            logger.info("gradinit: uses that keep alpha*W in the simulated step: %s", ", ".join(self.unstepped.names))
        self.loss_fn = loss_in_precision(loss_fn, config.precision, self.scaled.params[0].device.type)
        bounds = dict(min_scale=self.scaled.min_scales, max_scale=self.scaled.max_scales)
        self.adam = ScaleAdam(self.alpha, config, **bounds)
        # With per-branch moments a constraint step after a run of objective steps is not damped by
        # their second moments (or pushed by their momentum), and vice versa.
        self.adam_constraint = ScaleAdam(self.alpha, config, **bounds) if config.adam_state == "per_branch" else self.adam
        self.history: List[IterationRecord] = []
        self._pending: Optional[tuple] = None  # (record, loss_s_tilde tensor, ok tensor)
        self._consecutive_skips = 0
        self._last_branch = ""

    # -- the two branches ---------------------------------------------------------------------
    def grad_norm(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        norms = foreach_norm(grads, self.cfg.norm_p)
        return norms.sum() if self.cfg.norm_p == 1 else norms.pow(2).sum().sqrt()

    def step_direction(self, grads: List[torch.Tensor], gnorm: torch.Tensor) -> List[torch.Tensor]:
        """A[g], computed in place in ``grads`` (one kernel where they are :class:`FlatViews`)."""
        flat = getattr(grads, "flat", None)
        if self.cfg.optimizer == "adam":
            flat.sign_() if flat is not None else torch._foreach_sign_(grads)
            return grads
        if self.cfg.sgd_step == "normalized":
            factor = (self.gamma / gnorm.clamp(min=1e-12)).to(grads[0].dtype)
            flat.mul_(factor) if flat is not None else torch._foreach_mul_(grads, factor)
        return grads

    def _norm_grad(self, gbar: List[torch.Tensor], gnorm: torch.Tensor) -> List[torch.Tensor]:
        """v = d||gbar||_p / d gbar."""
        flat = getattr(gbar, "flat", None)
        if flat is not None:
            if self.cfg.norm_p == 1:
                return self.scaled.views(flat.sign())
            return self.scaled.views(flat * (1.0 / gnorm.clamp(min=1e-12)).to(flat.dtype))
        if self.cfg.norm_p == 1:
            return list(torch._foreach_sign(gbar))
        inv = 1.0 / gnorm.clamp(min=1e-12)
        return list(torch._foreach_mul(gbar, inv.to(gbar[0].dtype)))

    def _constraint_grad(self, s, gbar: List[torch.Tensor], gnorm: torch.Tensor,
                         g_local: Optional[Sequence[Optional[torch.Tensor]]] = None) -> torch.Tensor:
        """d||gbar||_p / d alpha by double backward through ``g_local``, this rank's gradient on S
        with its graph (computed here by a second-order pass on S when not given)."""
        v = self._norm_grad(gbar, gnorm)
        params = self.scaled.params
        # ||mean_r g_r|| has gradient mean_r <v, dg_r/dalpha>: each rank differentiates <v, g_r>,
        # as one vector-Jacobian product d<g_r, v>/dtheta = (dg_r/dtheta)^T v (no per-tensor products).
        with math_attention():
            if g_local is None:
                loss = check_loss(self.loss_fn(self.model, s))
                g_local = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
                del loss
            used = [(gi, vi) for gi, vi in zip(g_local, v) if gi is not None and gi.requires_grad]
            if not used:
                return torch.zeros_like(self.alpha)
            hv = torch.autograd.grad([gi for gi, _ in used], params, grad_outputs=[vi for _, vi in used],
                                     allow_unused=True)
        del g_local, used, v
        h = self.scaled.gather([torch.zeros_like(p) if hi is None else hi for p, hi in zip(params, hv)])
        del hv
        return self.scaled.alpha_grad(h, consume=True)

    def _constraint_grad_fd(self, s, gbar: List[torch.Tensor], gnorm: torch.Tensor,
                            g_all: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
        """d||gbar||_p / d alpha = <H v, W_i> with H v from a forward difference of the gradient on
        S. Each rank returns (<g_r(theta + eps v), W_i> - <g_all, W_i>) / eps; their mean is the
        difference quotient of the averaged gradient. ``g_all`` is gbar with the fixed tensors'
        gradients too (their scales also move gbar; default: gbar)."""
        # float64 products: the difference of the two is ~eps times smaller than either.
        base = self.scaled.alpha_grad(gbar if g_all is None else g_all, torch.float64)
        v = self._norm_grad(gbar, gnorm)
        params = self.scaled.params
        with torch.no_grad():
            eps = self.cfg.fd_eps * _sq_norm(params).sqrt() / _sq_norm(v).sqrt().clamp(min=1e-30)
        self.scaled.write(self.alpha, direction=v, eta=-eps.to(params[0].dtype))
        del v
        loss = check_loss(self.loss_fn(self.model, s))
        h = self.scaled.gather(gradients(loss, params))
        del loss
        return ((self.scaled.alpha_grad(h, torch.float64, consume=True) - base) / eps).to(self.alpha.dtype)

    def _lookahead_direction(self, s, grads: List[torch.Tensor]) -> List[torch.Tensor]:
        """The sum u_1 + ... + u_K of K simulated Adam updates from alpha W (``lookahead_steps``),
        Adam's bias-corrected m_t / (sqrt(v_t) + 1e-8): u_1 from g (sign g up to eps / |g|), each later
        u_t from the gradient on S at alpha W - eta (u_1 + ... + u_{t-1}), averaged over ranks as g.
        The u_t are constants of the objective, as A[g] is: its derivative in alpha_i stays
        <dL/dtheta_i, W_i>."""
        b1, b2 = self.cfg.lookahead_betas
        m = [torch.zeros_like(g) for g in grads]
        v = [torch.zeros_like(g) for g in grads]
        total = [torch.zeros_like(g) for g in grads]
        g = grads
        for t in range(1, self.cfg.lookahead_steps + 1):
            if t > 1:
                self.scaled.write(self.alpha, direction=total, eta=self.cfg.eta)
                loss = check_loss(self.loss_fn(self.model, s))
                g = self.scaled.gather(gradients(loss, self.scaled.params))
                del loss
                self.dist.mean_([g.flat] if isinstance(g, FlatViews) else g)
                g = self.scaled.without_fixed(g)
            torch._foreach_mul_(m, b1)
            torch._foreach_add_(m, g, alpha=1.0 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, g, g, value=1.0 - b2)
            denom = torch._foreach_add(torch._foreach_sqrt(torch._foreach_div(v, 1.0 - b2 ** t)), 1e-8)
            torch._foreach_add_(total, torch._foreach_div(torch._foreach_div(m, 1.0 - b1 ** t), denom))
            del denom
        return total

    def _objective_grad(self, s_tilde, direction: List[torch.Tensor]):
        """d L(S~; alpha W - eta A) / d alpha / eta with A held constant, and the loss."""
        if self.unstepped is None:
            self.scaled.write(self.alpha, direction=direction, eta=self.cfg.eta)
            loss = check_loss(self.loss_fn(self.model, s_tilde))
            h = self.scaled.gather(gradients(loss, self.scaled.params))  # the autograd tensors go at once
            return self.scaled.alpha_grad(h, consume=True) / self.cfg.eta, loss.detach().to(self.alpha.dtype)
        self.unstepped.drop_steps(direction)
        self.scaled.write(self.alpha, direction=direction, eta=self.cfg.eta)
        unstepped_weights = {i: self.scaled.W[i] * self.alpha[i].to(self.scaled.W[i].dtype)
                             for i, _, _ in self.unstepped.partial}
        params = self.scaled.params
        with self.unstepped.untied(unstepped_weights) as leaves:
            loss = check_loss(self.loss_fn(self.model, s_tilde))
            h = gradients(loss, list(params) + [leaf for _, leaf in leaves])
        for k, (i, _) in enumerate(leaves):
            h[i] = h[i] + h[len(params) + k]  # both uses depend on alpha_i through W_i
        return self.scaled.alpha_grad(h[:len(params)]) / self.cfg.eta, loss.detach().to(self.alpha.dtype)

    # -- bookkeeping ----------------------------------------------------------------------
    def _flush_pending(self, values: Optional[List[float]] = None) -> None:
        if self._pending is None:
            return
        rec, loss_t, ok = self._pending
        self._pending = None
        if values is None:
            values = torch.stack([loss_t, ok.float()]).tolist()
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
        a, mask = self.alpha.detach(), self.scaled.scaled  # no boolean indexing: it would read the mask
        head = [torch.where(mask, a, math.inf).min(), (a * mask).sum() / mask.sum(),
                torch.where(mask, a, -math.inf).max()]
        pending = self._pending is not None and not settled_only
        if pending:
            head += [self._pending[1].to(a.dtype), self._pending[2].to(a.dtype)]
        values = torch.stack(head).tolist()
        if pending:
            self._flush_pending(values[3:5])
        stats = values[:3]
        rec = self.history[self.settled - 1] if settled_only else self.history[-1]
        it = rec.iteration if settled_only else it
        tot = f"/{total}" if total else ""
        fmt = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
        logger.info(
            "gradinit iter %d%s | %s | L(S) %s | L(S~) %s | |g|_%d %s (gamma %.4g) | scale min/mean/max "
            "%.4g/%.4g/%.4g | skipped %d%s", it, tot, rec.branch, fmt(rec.loss_s), fmt(rec.loss_s_tilde),
            self.cfg.norm_p, fmt(rec.grad_norm), self.gamma or float("nan"), *stats,
            sum(r.branch == "skipped" for r in self.history), f" | {timing}" if timing else "",
        )

    # -- one iteration --------------------------------------------------------------------
    def step(self, pair: BatchPair) -> IterationRecord:
        """One iteration of Algorithm 1 on the pair (S, S~), in ``config.precision``."""
        with phase_precision(self.cfg.precision):
            return self._step(pair)

    def _step(self, pair: BatchPair) -> IterationRecord:
        params = self.scaled.params
        s, s_tilde = pair
        it = len(self.history) + 1
        self.scaled.write(self.alpha)
        # Constraint iterations come in runs (the norm comes down over many steps): after one,
        # build the second-order graph of S in this first pass already, so that a constraint
        # iteration costs one pass over S instead of two. A wrong guess costs only the graph's
        # memory, released before the objective pass over S~.
        fd = self.cfg.constraint_grad == "finite_difference"
        speculate = self.cfg.reuse_graph and self._last_branch == "constraint" and not fd
        g_local = None
        with math_attention() if speculate else contextlib.nullcontext():
            loss = check_loss(self.loss_fn(self.model, s))
            if speculate:
                g_local = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
                grads = [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, g_local)]
            else:
                grads = gradients(loss, params)
        # From here on g is one zero-padded buffer (a copy, also of the graph's gradients): the
        # norm, A[g], the step and the all-reduce are a few kernels each, not one per tensor.
        grads = self.scaled.gather(grads)
        loss_s = loss.detach().to(self.alpha.dtype).reshape(1)
        del loss
        self.dist.mean_([grads.flat] if isinstance(grads, FlatViews) else grads)
        self.dist.mean_([loss_s])
        g_all, grads = grads, self.scaled.without_fixed(grads)
        gnorm = self.grad_norm(grads)
        finite = torch.isfinite(loss_s[0]) & torch.isfinite(gnorm)
        # The only host sync of the iteration: the branch depends on it. It also collects the
        # previous iteration's deferred S~ statistics.
        head = [loss_s[0], gnorm, finite.float()]
        if self._pending is not None:
            head += [self._pending[1], self._pending[2].float()]
        values = torch.stack(head).tolist()
        if self._pending is not None:
            self._flush_pending(values[3:5])
        loss_v, gnorm_v, finite_v = values[:3]
        rec = IterationRecord(iteration=it, branch="", loss_s=loss_v, grad_norm=gnorm_v)
        self.history.append(rec)
        if finite_v < 0.5:
            rec.branch, rec.reason = "skipped", "non-finite loss or gradient on S"
            self._last_branch = rec.branch
            self._skip(rec)
            return rec

        if self.gamma is None:  # gamma_init_factor: no scale has moved yet (skipped iterations do not step)
            self.gamma = self.cfg.gamma_init_factor * gnorm_v
            logger.info("gradinit: gamma = %g x ||g||_%d at the init (%.6g) = %.6g", self.cfg.gamma_init_factor,
                        self.cfg.norm_p, gnorm_v, self.gamma)
        if gnorm_v > self.gamma:
            rec.branch = self._last_branch = "constraint"
            if fd:
                alpha_grad = self._constraint_grad_fd(s, grads, gnorm, g_all)
            else:
                alpha_grad = self._constraint_grad(s, grads, gnorm, g_local)
            del grads, g_local, g_all
            self.dist.mean_([alpha_grad])
            ok = torch.ones((), dtype=torch.bool, device=self.alpha.device)
            new_alpha, ok = self.adam_constraint.step(self.alpha, alpha_grad, ok)
            self._pending = (rec, torch.zeros((), dtype=self.alpha.dtype, device=self.alpha.device), ok)
        else:
            rec.branch = self._last_branch = "objective"
            del g_local, g_all
            if self.cfg.lookahead_steps > 1:
                direction = self._lookahead_direction(s, grads)
            else:
                direction = self.step_direction(grads, gnorm)
            alpha_grad, loss_t = self._objective_grad(s_tilde, direction)
            del direction, grads
            loss_t = loss_t.reshape(1)
            self.dist.mean_([alpha_grad, loss_t])
            ok = torch.isfinite(loss_t[0])
            new_alpha, ok = self.adam.step(self.alpha, alpha_grad, ok)
            self._pending = (rec, loss_t[0], ok)
        self.dist.broadcast_([new_alpha])
        self.alpha.copy_(new_alpha)
        return rec

    # -- interrupting and resuming ---------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the loop needs to continue after the last completed iteration (CPU tensors):
        the scales, the scales' Adam moments, the history and the branch state, with the names and
        squared norms of the W_i and the config, against which :meth:`load_state_dict` checks."""
        self._flush_pending()
        separate = self.adam_constraint is not self.adam
        return {
            "format": 1, "names": list(self.scaled.names), "w_sq_norms": self._w_sq_norms(),
            "config": _result_settings(self.cfg), "alpha": self.alpha.detach().cpu().clone(),
            "adam": self.adam.state_dict(), "adam_constraint": self.adam_constraint.state_dict() if separate else None,
            "history": [dataclasses.asdict(r) for r in self.history],
            "consecutive_skips": self._consecutive_skips, "last_branch": self._last_branch, "gamma": self.gamma,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of an interrupted run of the same model, initial weights
        and settings (``ValueError`` naming what differs otherwise)."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise ValueError("not a GradInit state (expected the dict of GradInit.state_dict())")
        if state["names"] != list(self.scaled.names):
            raise ValueError("the GradInit state was saved for other tensors: e.g. "
                             f"{sorted(set(state['names']) ^ set(self.scaled.names))[:3]}")
        saved_w, own_w = torch.tensor(state["w_sq_norms"]), torch.tensor(self._w_sq_norms())
        if not torch.allclose(saved_w, own_w, rtol=1e-6, atol=0):
            k = int((saved_w - own_w).abs().argmax())
            raise ValueError(f"the GradInit state was saved for other initial weights ({self.scaled.names[k]!r} "
                             "differs): resume with the same model, seed and data, or start GradInit anew")
        own_cfg = _result_settings(self.cfg)
        diff = sorted(k for k in set(own_cfg) | set(state["config"]) if own_cfg.get(k) != state["config"].get(k))
        if diff:
            raise ValueError(f"the GradInit state was saved with other settings: {', '.join(diff)}")
        with torch.no_grad():
            self.alpha.copy_(state["alpha"].to(self.alpha))
        self.adam.load_state_dict(state["adam"])
        if self.adam_constraint is not self.adam:
            self.adam_constraint.load_state_dict(state["adam_constraint"])
        self.history = [IterationRecord(**r) for r in state["history"]]
        self._pending = None
        self._consecutive_skips = int(state["consecutive_skips"])
        self._last_branch = str(state["last_branch"])
        if self.cfg.gamma_init_factor is not None and state.get("gamma") is not None:
            self.gamma = float(state["gamma"])

    def _w_sq_norms(self) -> List[float]:
        return [float(w.detach().double().pow(2).sum()) for w in self.scaled.W]

    @property
    def settled(self) -> int:
        """How many records of ``history`` are final (the last one waits for its S~ statistics)."""
        return len(self.history) - (self._pending is not None)

    def finalize(self) -> None:
        if self._pending is not None:
            self._flush_pending()
        self.scaled.write(self.alpha)


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

    Returns:
        A :class:`GradInitResult`. The model then holds alpha_i * W_i; its train/eval flags and
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
    with gradinit_mode(inner, dropout=config.dropout):
        run_iterations(engine, _pair_stream(batches, config), config.iters, log_interval=config.log_interval,
                       callback=callback, name="GradInit", log_seconds=config.log_seconds,
                       start=len(engine.history), every=every)
    wall = time.perf_counter() - start
    result = GradInitResult(
        scales=engine.scaled.scales_dict(),
        config=config,
        history=engine.history,
        wall_time=wall,
        aliases=engine.scaled.aliases,
        world_size=engine.dist.world_size,
        gamma=engine.gamma,
    )
    # The one measured time of the phase: gradinit.json's wall_time and the plugin's summary line say the same.
    logger.info("gradinit: %d iterations (%d objective, %d constraint, %d skipped) in %s",
                len(result.history), result.num_objective, result.num_constraint, result.num_skipped,
                format_duration(wall))
    advice = no_objective_advice([r.branch for r in result.history], [r.grad_norm for r in result.history],
                                 engine.gamma, config.norm_p)
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
