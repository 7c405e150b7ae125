"""The loss GradInit differentiates in fairseq, shared by the phase and the analysis of its results."""


def mean_loss_fn(criterion):
    """The loss the optimizer differentiates: fairseq's summed loss divided by the sample size."""

    def loss_fn(model, sample):
        loss, sample_size, _ = criterion(model, sample)
        return loss / max(float(sample_size), 1.0)

    return loss_fn
