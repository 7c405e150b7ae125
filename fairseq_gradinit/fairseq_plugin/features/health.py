"""The health check of a GradInit result in fairseq: measured on a GradInit batch, logged, stored.

:func:`~fairseq_gradinit.core.health.scale_health` runs the criterion's forward pass on the S batch
of GradInit's last iteration (no extra data) with the weights before and after the scales, and the
plugin stores its ``to_dict()`` as the ``health`` block of ``gradinit.json``
(:func:`fairseq_gradinit.fairseq_plugin.analysis.per_layer.health_of_saved` measures the same block
for an existing file). The engine's check knows no model family: :data:`FAIRSEQ_STRUCTURE` gives it
fairseq's blocks and multiplicative pairs.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Optional, Sequence

import torch

from ...core.health import ModelStructure, ScaleHealth, scale_health, scale_verdict

logger = logging.getLogger(__name__)

#: fairseq's module names: the blocks are the layers of its Transformer stacks (``encoder.layers.3``; other
#: parameters go by their numbered or own module), and the multiplicative pairs are MultiheadAttention's
#: query & key and value & output projections and a Transformer layer's two FFN layers.
FAIRSEQ_STRUCTURE = ModelStructure(pairs=(("q_proj", "k_proj"), ("v_proj", "out_proj"), ("fc1", "fc2")),
                                   blocks=r"(encoder|decoder)\.layers\.\d+", sides=("encoder", "decoder"))


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
                   initial: Optional[Mapping[str, torch.Tensor]], config, loss_fn=None,
                   history: Optional[Sequence[Any]] = None, gamma: Optional[float] = None) -> dict:
    """The ``health`` block for ``model`` (holding the scaled weights) on one ``sample`` through
    ``criterion(model, sample)``, with each block's gradient from ``loss_fn(model, sample)`` (the
    mean loss GradInit differentiates) and the phase's ``history`` and ``gamma``; logged. A failure
    of the check is logged and recorded (``verdict`` "unknown", ``error``) instead of stopping the run."""
    try:
        if sample is None:
            health = scale_verdict(scales, config=config, history=history, gamma=gamma, structure=FAIRSEQ_STRUCTURE)
        else:
            loss = None if loss_fn is None else (lambda m: loss_fn(m, sample))
            health = scale_health(model, scales, lambda m: criterion(m, sample), initial=initial, config=config,
                                  loss=loss, history=history, gamma=gamma, structure=FAIRSEQ_STRUCTURE)
    except Exception as e:  # noqa: BLE001 - the check must never cost the user the GradInit result
        logger.warning("gradinit: the health check failed (%s: %s); the scales are saved without it",
                       type(e).__name__, e)
        return {"verdict": "unknown", "error": f"{type(e).__name__}: {e}"}
    log_health(health)
    out = health.to_dict()
    if sample is not None:
        out["batch"] = batch_size(sample)
    return out


def nonfinite_blocks(health: Optional[Mapping[str, Any]]) -> list:
    """The blocks of a ``health`` block (:func:`measure_health`) whose gradient at the scales is not finite
    on the batch measured (a NaN or inf loss gives NaN gradients): training from these scales stops at its
    first update with NaN/Inf gradients. Empty where no gradient was measured."""
    blocks = (health or {}).get("blocks") or []
    return [b.get("name") for b in blocks if isinstance(b, Mapping)
            and not (isinstance(b.get("rms_after"), (int, float)) and math.isfinite(b["rms_after"]))]


def batch_size(sample: Mapping[str, Any]) -> dict:
    """Sentences and tokens of a fairseq sample."""
    return {"sentences": int(sample.get("nsentences", 0) or 0), "tokens": int(sample.get("ntokens", 0) or 0)}
