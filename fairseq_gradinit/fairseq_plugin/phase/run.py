"""One GradInit run, resolved before the phase starts: :class:`GradInitRun`.

The task (:class:`~..registration.hook.GradInitTaskMixin`) builds it once, when its criterion exists, from what
only the task knows (its training data, its config, the model's arguments as given, the cuDNN
attention guard's decision), and hands it to the phase (:mod:`.compute`). The phase reads the run and
the model and returns its result; it never sees the task, so data flows one way: fairseq to the task
to the run to the phase.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional

import torch.distributed as dist

from ..data.batches import BatchSource
from ..data.loss import MeanLoss
from ..settings.plan import RunPlan
from .state import state_path

#: The file of a run's scales in ``--save-dir`` (never overwritten).
GRADINIT_JSON = "gradinit.json"


def rank_world():
    """(this process's rank, the number of ranks): (0, 1) outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclasses.dataclass(frozen=True)
class GradInitRun:
    """Everything the phase needs, and nothing of the task: data, built once per run.

    ``batches`` gives the endless (S, S~) pairs of each rank (:class:`~..data.batches.BatchSource`, the
    task's training batches as data: ``batches.pairs(overlap, device, rank=, world=, skip=)``), None where
    they could not be made (``batches_error`` says why); ``loss_fn(model, sample)`` the mean loss GradInit
    differentiates and ``criterion(model, sample)`` fairseq's criterion (the health check runs both);
    ``valid_split_error`` fairseq's refusal of the validation split, found before the handover (None:
    none). ``fingerprint`` is rank 0's (None on the other ranks).
    """

    plan: RunPlan
    fingerprint: Optional[Mapping[str, Any]]
    batches: Optional[BatchSource]
    loss_fn: MeanLoss
    criterion: Any
    batches_error: Optional[str] = None
    valid_split_error: Optional[str] = None
    #: The cuDNN attention guard's decision (recorded in gradinit.json), None where the task made none.
    sdpa_guard: Optional[Mapping[str, Any]] = None

    @property
    def save_dir(self) -> str:
        return self.plan.save_dir

    @property
    def result_path(self) -> str:
        """``--save-dir``'s gradinit.json."""
        return os.path.join(self.plan.save_dir, GRADINIT_JSON)

    @property
    def state_path(self) -> str:
        """``--save-dir``'s phase state (:mod:`.state`)."""
        return state_path(self.plan.save_dir)
