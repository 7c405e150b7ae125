"""The loss GradInit differentiates in fairseq, shared by the phase and the analysis of its results."""
import dataclasses
import math
from typing import Any, Optional

import torch

#: The key of an S~ sample whose objective rewards source use (``--gradinit-source-contrast``): its value is
#: the weight lambda of :class:`MeanLoss`'s contrast.
SOURCE_CONTRAST_KEY = "gradinit_source_contrast"
#: The key of the contrast's margin in bits per token (``--gradinit-source-margin``), beside
#: :data:`SOURCE_CONTRAST_KEY`: a gap beyond it is not rewarded.
SOURCE_MARGIN_KEY = "gradinit_source_margin"


def has_source(sample) -> bool:
    """Whether a batch is an encoder-decoder one: a source to roll and a decoder input."""
    net_input = (sample or {}).get("net_input") or {}
    return torch.is_tensor(net_input.get("src_tokens")) and "prev_output_tokens" in net_input


def rolled_sources(sample) -> Optional[dict]:
    """``sample`` with each sentence given the previous sentence's source (the rows of ``src_tokens`` and
    ``src_lengths`` rolled by one, so padding stays consistent); None for a batch of one sentence."""
    net_input = sample["net_input"]
    tokens = net_input["src_tokens"]
    if tokens.dim() < 1 or tokens.shape[0] < 2:
        return None
    out = dict(net_input)
    out["src_tokens"] = tokens.roll(1, dims=0)
    if torch.is_tensor(net_input.get("src_lengths")) and net_input["src_lengths"].shape[:1] == tokens.shape[:1]:
        out["src_lengths"] = net_input["src_lengths"].roll(1, dims=0)
    return {**sample, "net_input": out}


@dataclasses.dataclass(frozen=True)
class MeanLoss:
    """The loss the optimizer differentiates: fairseq's summed loss of ``criterion`` divided by the sample
    size, called as ``loss_fn(model, sample)``. Data (the criterion it reads), not a closure: a run that
    holds it can be inspected.

    A sample marked with :data:`SOURCE_CONTRAST_KEY` (weight lambda; the phase marks S~ with
    ``--gradinit-source-contrast``) is scored as ``L + lambda (L - L_rolled)``, where ``L_rolled`` is the loss with
    the sources rolled across the batch: GradInit's objective then prefers scales under which the simulated
    steps make the model depend on the right source, not scales that silence the encoder (a decoder that
    ignores its source lowers L as fast, and L_rolled with it). With a margin m (bits per token,
    :data:`SOURCE_MARGIN_KEY`) the term is ``lambda max(0, m - (L_rolled - L))`` instead: the objective stops
    rewarding the gap once it is m, so the scales cannot buy a wider gap with a higher loss."""

    criterion: Any

    def __call__(self, model, sample):
        loss, sample_size, _ = self.criterion(model, sample)
        weight = sample.get(SOURCE_CONTRAST_KEY) if isinstance(sample, dict) else None
        if weight:
            if not has_source(sample):
                raise ValueError("--gradinit-source-contrast needs batches with a source (an encoder-decoder task, "
                                 "e.g. translation); leave it out for this task")
            other = rolled_sources(sample)
            if other is not None:  # one sentence: nothing to roll, the plain loss
                rolled_loss, _, _ = self.criterion(model, other)
                margin = sample.get(SOURCE_MARGIN_KEY)
                if margin:  # fairseq's losses are sums in nats: the margin over the sample, in nats
                    short = float(margin) * math.log(2) * float(sample_size) - (rolled_loss - loss)
                    loss = loss + float(weight) * torch.clamp(short, min=0)
                else:
                    loss = loss + float(weight) * (loss - rolled_loss)
        return loss / max(float(sample_size), 1.0)


def mean_loss_fn(criterion) -> MeanLoss:
    """:class:`MeanLoss` of ``criterion``."""
    return MeanLoss(criterion)
