"""What the scale-learning engines share (GradInit and MetaInit): the loss contract, gradients,
config resolution and the iteration driver that leaves the model as it was given on failure."""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
from torch import nn

from .progress import ProgressClock
from .scales import ScaledParameters

#: ``loss_fn(model, batch) -> scalar loss tensor``.
LossFn = Callable[[nn.Module, Any], torch.Tensor]


def gradients(loss: torch.Tensor, params: Sequence[torch.Tensor], create_graph: bool = False) -> List[torch.Tensor]:
    """d loss / d params, zeros for parameters the loss does not use."""
    grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def check_loss(loss: Any) -> torch.Tensor:
    """``loss`` if it is a scalar tensor that requires grad, else a ``ValueError`` saying what is wrong."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(
            "loss_fn(model, batch) must return a scalar tensor (the mean loss of the batch), "
            f"got {type(loss).__name__}{'' if not isinstance(loss, torch.Tensor) else tuple(loss.shape)}"
        )
    if not loss.requires_grad:
        raise ValueError("the loss returned by loss_fn does not require grad: is the forward pass "
                         "run under torch.no_grad() or are all parameters frozen?")
    return loss


def resolve_config(cls, config, overrides: dict):
    """``config`` (validated again), a copy with ``overrides``, or ``cls(**overrides)``."""
    if config is None:
        return cls(**overrides)
    if overrides:
        return dataclasses.replace(config, **overrides)
    config.validate()
    return config


def check_inputs(model: Any, loss_fn: Any) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise ValueError("loss_fn must be callable as loss_fn(model, batch) -> scalar loss tensor")
    error = unsupported_parameter_error(model)
    if error:
        raise ValueError(error)


def unsupported_parameter_error(model: nn.Module) -> Optional[str]:
    """Why a trainable parameter of ``model`` cannot get a scale, or None: a complex tensor (a real scale
    and the norms of its gradient are not defined on it here), or the weight of an ``nn.Embedding`` /
    ``nn.EmbeddingBag`` with ``sparse=True`` (its gradient is sparse, which the second-order pass cannot take)."""
    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse and module.weight.requires_grad:
            name = f"{module_name}.weight" if module_name else "weight"
            return (f"parameter {name!r} is the weight of an {type(module).__name__} with sparse=True, whose gradient "
                    "is sparse; GradInit differentiates gradients, which sparse ones cannot be: build it with "
                    "sparse=False for GradInit (its scaled weights then serve a sparse one as well)")
    for name, p in model.named_parameters():
        if p.requires_grad and p.is_complex():
            return (f"parameter {name!r} is a complex tensor ({p.dtype}); GradInit learns real scales of real "
                    "tensors: store it as two real tensors (real and imaginary parts)")
    return None


def nothing_done_error(name: str, completed: int, total: Optional[int]) -> Optional[str]:
    """Why a run that was asked for iterations and completed none returns no result, or None: the
    one rule of every entry point (the Python API, MetaInit, the fairseq plugin, ``train_vision``),
    so that work asked for and not done never looks like a result of scales 1."""
    if completed > 0 or total == 0:
        return None
    return (f"{name}: the batches ran out before the first iteration (the loader gave "
            f"{'no batch' if total is None else 'too few batches'}); no scale was learned and the model is left "
            "as it was given. Pass a loader that yields batches (GradInit pairs consecutive batches: at least 2), "
            "and check that it is not an exhausted iterator")


def unusable_result_error(scales: torch.Tensor, history: Sequence[Any], name: str) -> Optional[str]:
    """Why the ``scales`` a run ends with are no result, or None: scales that are not finite numbers, or
    a run whose last iterations (``history``) were skipped for a non-finite loss or gradient, since the
    scales it ends with are those that gave NaN/Inf on those batches. The one rule of every entry point,
    so that such scales are never written or applied."""
    if not bool(torch.isfinite(scales.detach()).all()):
        return (f"{name}: the learned scales are not all finite numbers; no scale is applied and the model is left "
                "as it was given. Lower the learning rates, or set max_scale")
    tail = 0
    for rec in reversed(history):
        if rec.branch != "skipped":
            break
        tail += 1
    if tail:
        return (f"{name}: the last {tail} iteration{'s' if tail > 1 else ''} had a non-finite loss or gradient at the "
                f"final scales ({history[-1].reason}), so these scales give NaN/Inf on the data; they are not "
                "applied and the model is left as it was given. Check the data and the loss for NaN/Inf, lower the "
                "learning rates, or set max_scale")
    return None


def run_iterations(engine, scaled: ScaledParameters, stream: Iterator[Any], total: Optional[int], *,
                   log_interval: int, callback: Optional[Callable[[Any], None]], name: str, log_seconds: float = 0.0,
                   start: int = 0, every: Optional[tuple] = None) -> int:
    """Drive ``engine.step`` over ``stream`` for ``total`` iterations (``None``: until it ends).

    ``engine`` has ``step``, ``history``, ``settled`` (records that are final), ``finalize`` and
    ``log_progress(completed, total, timing=..., settled_only=...)``; ``scaled`` holds the tensors it
    writes and the scales it steps (``scaled.alpha``, updated in place). Progress is
    logged at the first iteration, every ``log_interval`` iterations and at the end, and also whenever
    ``log_seconds`` of wall time have passed (0: never); those lines show the last settled record, as
    reading a pending one would sync the host at a moment that differs between data-parallel ranks. On success the model holds alpha*W of the last update; if
    anything raises, or every iteration was skipped (``FloatingPointError``), it holds W, the
    weights it was given; a run that completed no iteration although asked for some raises
    ``ValueError`` (:func:`nothing_done_error`). ``start`` iterations were completed before (a resumed run), and
    ``every = (n, fn)`` calls ``fn()`` after every n-th iteration. Returns the number of completed
    iterations, ``start`` included.
    """
    completed = reported = logged = start
    clock = ProgressClock(every_iters=log_interval, every_seconds=log_seconds, first=start)

    def report():
        nonlocal reported
        if callback is not None:
            for rec in engine.history[reported:engine.settled]:
                callback(rec)
        reported = engine.settled

    try:
        if total is None or completed < total:
            for item in stream:
                engine.step(item)
                completed += 1
                report()
                if every is not None and completed % every[0] == 0 and (total is None or completed < total):
                    every[1]()
                due = clock.due(completed)
                if due == "time" and total is not None and completed >= total:
                    due = None  # the final line follows
                if due:
                    engine.log_progress(completed, total, timing=clock.timing(completed, total),
                                        settled_only=due == "time")
                    logged = completed if due == "iterations" else logged
                if total is not None and completed >= total:
                    break
        nothing = nothing_done_error(name, completed, total)
        if nothing:
            raise ValueError(nothing)
        if total is not None and completed < total:
            warnings.warn(f"{name}: the batches ran out after {completed} of {total} iterations",
                          RuntimeWarning, stacklevel=3)
        engine.finalize()
        report()
        if engine.history and all(r.branch == "skipped" for r in engine.history):
            n = len(engine.history)
            raise FloatingPointError(
                f"{name}: all {n} iteration{'s were' if n > 1 else ' was'} skipped ({engine.history[-1].reason}); "
                "no scale was learned and the model is left as it was given. Check the data and the loss "
                "for NaN/Inf (e.g. run one batch through the model), or lower the learning rates.")
        unusable = unusable_result_error(scaled.alpha, engine.history, name)
        if unusable:
            raise FloatingPointError(unusable)
    except BaseException:
        # A half-finished run must not leave the model partly scaled: alpha = 1 gives back W exactly.
        with torch.no_grad():
            scaled.write(torch.ones_like(scaled.alpha))
        raise
    if engine.history and logged != completed:
        engine.log_progress(completed, total, timing=clock.timing(completed, total))
    return completed
