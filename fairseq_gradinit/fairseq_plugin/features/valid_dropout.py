"""The validation loss with dropout on, beside fairseq's eval-mode one (``--gradinit-valid-dropout-loss``).

A Post-LN Transformer trained without warmup can break down in eval mode only: its validation loss
(dropout off) jumps while the same model with dropout on still sits near its training loss. fairseq
validates in eval mode alone, so the breakdown cannot be told from a plateau without a second pass.
With the option, every validation batch is also scored with the model in train mode (no gradient),
and the validation line gets ``loss_dropout`` beside ``loss``, in the same units.

The second pass draws its dropout masks from a generator seeded by ``--seed`` inside a forked random
state, so it is deterministic and leaves the training's random sequence untouched.
"""
import math
from typing import Mapping, Sequence

import torch

#: The logged metric (the validation line's ``loss_dropout``) and its logging-output keys.
KEY = "loss_dropout"
SIZE_KEY = "loss_dropout_sample_size"


def _devices(sample) -> list:
    """The CUDA devices whose random state the pass touches (none on the CPU)."""
    tensors = []

    def walk(x):
        if torch.is_tensor(x):
            tensors.append(x)
        elif isinstance(x, Mapping):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(sample)
    return sorted({t.device.index or 0 for t in tensors if t.is_cuda})


def dropout_loss_output(model, criterion, sample, *, seed: int) -> dict:
    """The criterion's summed loss on ``sample`` with ``model`` in train mode (dropout on) and no
    gradient, as logging-output entries; ``model`` leaves in the mode it came in."""
    if not sample or "net_input" not in sample:  # fairseq's empty (dummy) validation batches
        return {}
    was_training = model.training
    with torch.random.fork_rng(devices=_devices(sample)), torch.no_grad():
        torch.manual_seed(seed)
        model.train()
        try:
            loss, sample_size, _ = criterion(model, sample)
        finally:
            model.train(was_training)
    return {KEY: float(loss), SIZE_KEY: float(sample_size)}


def reduce_dropout_loss(logging_outputs: Sequence[Mapping]) -> None:
    """Log ``loss_dropout`` (base 2, per token or sentence as the criterion's ``loss``) when the
    outputs carry it; training outputs do not, and then nothing is logged."""
    from fairseq import metrics

    outputs = [o for o in logging_outputs if KEY in o]
    size = sum(float(o.get(SIZE_KEY, 0.0)) for o in outputs)
    if not outputs or size <= 0:
        return
    total = sum(float(o[KEY]) for o in outputs)
    metrics.log_scalar(KEY, total / size / math.log(2), size, round=3)
