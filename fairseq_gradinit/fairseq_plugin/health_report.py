"""The health check of a GradInit result in fairseq: measured on a GradInit batch, logged, stored.

:func:`~fairseq_gradinit.core.health.scale_health` runs the criterion's forward pass on the S batch
of GradInit's last iteration (no extra data) with the weights before and after the scales, and the
plugin stores its ``to_dict()`` as the ``health`` block of ``gradinit.json``.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

import torch

from ..core.health import ScaleHealth, scale_health, scale_verdict

logger = logging.getLogger(__name__)


def log_health(health: ScaleHealth, *, log: Optional[logging.Logger] = None) -> None:
    """The short table of ``health``: a warning when degenerate, info otherwise."""
    log = log or logger
    level = logging.INFO if health.ok else logging.WARNING
    for line in health.table():
        log.log(level, "gradinit: %s", line)
    if not health.ok:
        log.warning("gradinit: the scales look degenerate; see the 'health' section of the docs "
                    "(docs/health.md) for what to do")


def measure_health(model, scales: Mapping[str, float], criterion, sample: Any, *,
                   initial: Optional[Mapping[str, torch.Tensor]], config) -> dict:
    """The ``health`` block for ``model`` (holding the scaled weights) on one ``sample`` through
    ``criterion(model, sample)``; logged. A failure of the check is logged and recorded
    (``verdict`` "unknown", ``error``) instead of stopping the run."""
    try:
        if sample is None:
            health = scale_verdict(scales, config=config)
        else:
            health = scale_health(model, scales, lambda m: criterion(m, sample), initial=initial, config=config)
    except Exception as e:  # noqa: BLE001 - the check must never cost the user the GradInit result
        logger.warning("gradinit: the health check failed (%s: %s); the scales are saved without it",
                       type(e).__name__, e)
        return {"verdict": "unknown", "error": f"{type(e).__name__}: {e}"}
    log_health(health)
    out = health.to_dict()
    if sample is not None:
        out["batch"] = batch_size(sample)
    return out


def saved_gradinit_batch(fm, saved: Mapping[str, Any]):
    """The S batch of the last GradInit iteration recorded in ``saved`` (a ``gradinit.json``), drawn
    again from the task's training data as the plugin drew it on rank 0, and a note when it cannot
    be the same batch (written before 0.3.0, or no ``max_tokens``: another training batch)."""
    from .hook import GradInitTaskMixin
    from .report import BATCHES_CHANGED_IN, training_batches, version_tuple

    conf = saved.get("config") or {}
    max_tokens = saved.get("max_tokens") or fm.cfg.dataset.max_tokens
    if not max_tokens:
        raise ValueError("pass --max-tokens among the fairseq arguments (the gradinit.json records no max_tokens)")
    n = max(1, int(saved.get("iterations") or len(saved.get("history") or ()) or 1))
    note = None
    written_by = (saved.get("fingerprint") or {}).get("version")
    if written_by is not None and version_tuple(written_by) < BATCHES_CHANGED_IN:
        note = (f"written by fairseq_gradinit {written_by}, which drew GradInit's batches differently: measured on "
                f"another training batch of {max_tokens} tokens")
        n = 1
    elif not saved.get("max_tokens"):
        note = f"the gradinit.json records no max_tokens: measured on a training batch of {max_tokens} tokens"
        n = 1
    if not isinstance(fm.task, GradInitTaskMixin):
        batch = training_batches(fm, num_batches=1, seed=int(fm.cfg.common.seed), max_tokens=int(max_tokens))[0]
        return batch, (f"the task {fm.cfg.task._name} does not draw GradInit's batches (pass the plugin's task, "
                       f"e.g. --task translation_gradinit): measured on a training batch of {max_tokens} tokens")
    pairs = fm.task.gradinit_pairs(fm.model, int(max_tokens), float(conf.get("overlap", 0.5)), fm.device,
                                   0, int(saved.get("world_size", 1) or 1))
    for _ in range(n):
        pair = next(pairs)
    return pair.s, note


def health_of_saved(fm, saved: Mapping[str, Any]) -> dict:
    """The ``health`` block of a saved ``gradinit.json`` (``saved``) for the freshly built model of
    ``fm`` (:class:`~.training.FairseqModel`, holding the initial weights W), measured on the S batch
    of the last recorded GradInit iteration; logged. The model is left holding W."""
    from ..core import apply_scales
    from ..core.health import snapshot_weights, swapped_weights
    from .tied import apply_multiplier_scales

    sample, note = saved_gradinit_batch(fm, saved)
    initial = snapshot_weights(fm.model)
    with swapped_weights(fm.model, initial):  # restores W on exit
        with torch.no_grad():
            apply_scales(fm.model, apply_multiplier_scales(fm.model, saved["scales"]))
        health = scale_health(fm.model, saved["scales"], lambda m: fm.criterion(m, sample), initial=initial,
                              config=saved.get("config"))
    if note:
        health.notes.append(note)
    log_health(health)
    return {**health.to_dict(), "batch": batch_size(sample)}


def batch_size(sample: Mapping[str, Any]) -> dict:
    """Sentences and tokens of a fairseq sample."""
    return {"sentences": int(sample.get("nsentences", 0) or 0), "tokens": int(sample.get("ntokens", 0) or 0)}
