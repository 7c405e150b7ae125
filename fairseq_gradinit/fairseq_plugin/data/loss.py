"""The loss GradInit differentiates in fairseq, shared by the phase and the analysis of its results."""
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MeanLoss:
    """The loss the optimizer differentiates: fairseq's summed loss of ``criterion`` divided by the sample
    size, called as ``loss_fn(model, sample)``. Data (the criterion it reads), not a closure: a run that
    holds it can be inspected."""

    criterion: Any

    def __call__(self, model, sample):
        loss, sample_size, _ = self.criterion(model, sample)
        return loss / max(float(sample_size), 1.0)


def mean_loss_fn(criterion) -> MeanLoss:
    """:class:`MeanLoss` of ``criterion``."""
    return MeanLoss(criterion)
