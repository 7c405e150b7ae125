"""Whether a translation model uses its source: the validation loss with the sources rolled across the batch.

Validation loss alone cannot tell a translation model from a target-side language model: a decoder that
ignores its encoder (for example because the initial scales silenced it) can reach a *lower* loss early,
since an unconditional language model learns faster. At every validation each batch is scored a second
time, in eval mode and without gradient, with sentence i given the source of sentence i-1 (the rows of
``src_tokens`` and ``src_lengths`` rolled by one, so padding stays consistent; batches of one sentence
are left out). The validation line gets ``loss_src_rolled`` and ``src_gap``: the rolled loss minus the
loss on the same batches, in bits per token (or per sentence, as the criterion's ``loss``). A model that
ignores its source has ``src_gap`` of about 0; a model that translates has a gap that grows with training.

On for encoder-decoder batches (``net_input`` with ``src_tokens`` and ``prev_output_tokens``); a task
without a source (language modeling) is skipped with one log line. Its cost is one more eval-mode
forward per validation batch (docs/monitor.md has the measurement).
"""
from __future__ import annotations

import logging
import math
from typing import Mapping, Optional, Sequence

import torch

from ..data.loss import has_source, rolled_sources as rolled

logger = logging.getLogger(__name__)

#: Choices of ``--gradinit-source-gap``.
SOURCE_GAP_MODES = ("auto", "on", "off")
#: The logged metrics and their logging-output keys.
ROLLED_KEY = "loss_src_rolled"
ROLLED_SIZE_KEY = "loss_src_rolled_sample_size"
ROLLED_BASE_KEY = "loss_src_base"  # the eval loss of the same (rolled-scored) batches
GAP_KEY = "src_gap"
#: The warning: a validation warns when, from GAP_WARN_FROM_UPDATE on, the model has learned something (its
#: loss at least LOSS_DROP bits below the run's first validated loss) but its source gap is below GAP_FLOOR.
#: The numbers come from the d=128 CPU testbed's runs with and without source use (docs/monitor.md#source-use
#: quotes them). The loss condition keeps a run whose long warmup has not started learning yet from being warned about.
GAP_WARN_FROM_UPDATE = 500
GAP_FLOOR = 0.25
LOSS_DROP = 1.0


def rolled_loss_output(model, criterion, sample, base_loss) -> dict:
    """Logging-output entries of the criterion's summed loss on ``sample`` with rolled sources (eval
    mode, no gradient) and the batch's own summed loss ``base_loss``; ``{}`` where nothing rolls."""
    if not sample or not has_source(sample):
        return {}
    other = rolled(sample)
    if other is None:
        return {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            loss, sample_size, _ = criterion(model, other)
    finally:
        model.train(was_training)
    return {ROLLED_KEY: float(loss), ROLLED_SIZE_KEY: float(sample_size), ROLLED_BASE_KEY: float(base_loss)}


def source_gap(logging_outputs: Sequence[Mapping]) -> Optional[dict]:
    """``{"loss_src_rolled", "src_gap", "sample_size"}`` (base 2) of a validation's outputs, None when
    none carries the rolled loss (training outputs, language models)."""
    outputs = [o for o in logging_outputs if ROLLED_KEY in o]
    size = sum(float(o.get(ROLLED_SIZE_KEY, 0.0)) for o in outputs)
    if not outputs or size <= 0:
        return None
    rolled_loss = sum(float(o[ROLLED_KEY]) for o in outputs) / size / math.log(2)
    base = sum(float(o[ROLLED_BASE_KEY]) for o in outputs) / size / math.log(2)
    return {ROLLED_KEY: rolled_loss, GAP_KEY: rolled_loss - base, "sample_size": size}


def gap_warns(gap: Optional[float], update: Optional[int], *, loss: Optional[float] = None,
              first_loss: Optional[float] = None) -> bool:
    """Whether a validation's source gap warns: from :data:`GAP_WARN_FROM_UPDATE` on, below :data:`GAP_FLOOR`,
    with the loss at least :data:`LOSS_DROP` bits below the first validation's (``first_loss``)."""
    finite = all(v is not None and math.isfinite(v) for v in (gap, loss, first_loss))
    return (finite and update is not None and update >= GAP_WARN_FROM_UPDATE and gap < GAP_FLOOR
            and first_loss - loss >= LOSS_DROP)


def warning_text(gap: float, update: int) -> str:
    return (f"source use: at update {update} the loss with each sentence given another's source is only "
            f"{gap:+.2f} bits above the loss: the model may be ignoring its source (docs/monitor.md#source-use)")


def log_source_gap(values: dict) -> None:
    """Log ``loss_src_rolled`` and ``src_gap`` on the validation line (and so in TensorBoard)."""
    from fairseq import metrics

    metrics.log_scalar(ROLLED_KEY, values[ROLLED_KEY], values["sample_size"], round=3)
    metrics.log_scalar(GAP_KEY, values[GAP_KEY], values["sample_size"], round=3)
