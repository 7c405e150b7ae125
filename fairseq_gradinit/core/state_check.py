"""The values of a saved GradInit state (:meth:`~.engine.GradInit.state_dict`), checked as a whole before a
run resumes from it: shapes, signs, keys and finiteness. A damaged state would otherwise resume with
broadcast or negative scales, or stop with a traceback (or ten skipped iterations) far from the file."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import torch


def _vector_problem(what: str, value: Any, n: int, *, nonnegative: bool) -> Optional[str]:
    """Why ``value`` is not a finite float vector of ``n`` entries (>= 0 where ``nonnegative``), or None."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return f"its {what} is {type(value).__name__}, not a float tensor"
    if tuple(value.shape) != (n,):
        return f"its {what} has shape {tuple(value.shape)}, but the model has {n} scaled tensors"
    if not bool(torch.isfinite(value).all()):
        return f"its {what} holds values that are not finite"
    if nonnegative and bool((value < 0).any()):
        return f"its {what} holds negative values, e.g. {float(value.min()):g}"
    return None


def _adam_problem(key: str, adam: Any, n: int) -> Optional[str]:
    if not isinstance(adam, Mapping):
        return f"its {key!r} is {type(adam).__name__}, not the dict of the scales' Adam state"
    for moment in ("m", "v"):
        problem = _vector_problem(f"{key!r} moment {moment!r}", adam.get(moment), n, nonnegative=moment == "v")
        if problem:
            return problem
    step = adam.get("step_count")
    if not (isinstance(step, torch.Tensor) and step.numel() == 1 and bool(torch.isfinite(step).all())
            and float(step) >= 0):
        return f"its {key!r} step count is not a count >= 0"
    return None


def state_values_problem(state: Mapping[str, Any], n: int, record_type: type, *,
                         separate_constraint: bool) -> Optional[str]:
    """Why the saved GradInit ``state`` for ``n`` scaled tensors cannot be resumed, or None: the scales
    (``alpha``) and the Adam moments must be finite vectors of ``n`` entries, the scales and second moments
    >= 0; each history entry must have exactly the fields of ``record_type`` (an ``IterationRecord``);
    the counters must be counts and gamma a finite number > 0."""
    if len(state.get("w_sq_norms") or ()) != n:
        return f"its 'w_sq_norms' has {len(state.get('w_sq_norms') or ())} entries, but the model has {n} scaled tensors"
    problem = _vector_problem("'alpha' (the scales)", state.get("alpha"), n, nonnegative=True)
    problem = problem or _adam_problem("adam", state.get("adam"), n)
    if not problem and separate_constraint:
        problem = _adam_problem("adam_constraint", state.get("adam_constraint"), n)
    if problem:
        return problem
    fields = {f.name for f in dataclasses.fields(record_type)}
    required = {f.name for f in dataclasses.fields(record_type)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    history = state.get("history")
    if not isinstance(history, list):
        return f"its 'history' is {type(history).__name__}, not a list"
    for i, record in enumerate(history):
        if not isinstance(record, Mapping):
            return f"its history entry {i + 1} is {type(record).__name__}, not a dict"
        extra, missing = sorted(set(record) - fields), sorted(required - set(record))
        if extra or missing:
            parts = ([f"keys no GradInit iteration has: {extra}"] if extra else []) + \
                ([f"no {missing}"] if missing else [])
            return f"its history entry {i + 1} has {' and '.join(parts)}"
    skips = state.get("consecutive_skips")
    if isinstance(skips, bool) or not isinstance(skips, int) or skips < 0:
        return f"its 'consecutive_skips' is {skips!r}, not a count >= 0"
    gamma = state.get("gamma")
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float))
                              or not math.isfinite(gamma) or gamma <= 0):
        return f"its 'gamma' is {gamma!r}, not a finite number > 0"
    return None
