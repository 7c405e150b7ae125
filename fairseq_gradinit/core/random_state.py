"""torch's random state in a GradInit state, so that a resumed run draws the dropout masks an
uninterrupted one draws.

The state is taken after an iteration and set again before the next one: the CPU generator and the
CUDA generator of every CUDA device the model's tensors are on, for every rank of the data-parallel
group (each rank draws its own masks), as CPU ``uint8`` tensors that ``torch.load(weights_only=True)``
reads.
"""
from __future__ import annotations

import logging
from typing import Iterable, List, Optional

import torch

from .distributed import DataParallelGroup

logger = logging.getLogger(__name__)


def _cuda_indices(tensors: Iterable[torch.Tensor]) -> List[int]:
    return sorted({t.device.index if t.device.index is not None else torch.cuda.current_device()
                   for t in tensors if t.device.type == "cuda"})


def capture_random_state(tensors: Iterable[torch.Tensor], group: DataParallelGroup) -> dict:
    """``{"cpu": [state of rank r], "cuda": [{device index: state} of rank r]}``; with more than one
    rank every rank must call it (it gathers)."""
    own = (torch.get_rng_state(), {i: torch.cuda.get_rng_state(i) for i in _cuda_indices(tensors)})
    ranks = group.all_gather_object(own)
    return {"cpu": [cpu for cpu, _ in ranks], "cuda": [cuda for _, cuda in ranks]}


def random_state_problem(saved) -> Optional[str]:
    """What makes ``saved`` (a state's ``"rng"``) unusable, or None."""
    if not isinstance(saved, dict) or not isinstance(saved.get("cpu"), list) or \
            not isinstance(saved.get("cuda"), list) or len(saved["cpu"]) != len(saved["cuda"]):
        return "its random state is not the dict of lists GradInit saves"
    for cpu, cuda in zip(saved["cpu"], saved["cuda"]):
        if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8 or not isinstance(cuda, dict) or \
                not all(isinstance(k, int) and isinstance(v, torch.Tensor) and v.dtype == torch.uint8
                        for k, v in cuda.items()):
            return "its random state holds entries that are not uint8 tensors by device"
    return None


def restore_random_state(saved: dict, tensors: Iterable[torch.Tensor], group: DataParallelGroup) -> bool:
    """Set this rank's generators to ``saved`` (checked by :func:`random_state_problem`). False (and
    nothing set) where it was saved by another number of ranks or lacks a CUDA device the model is on
    now: the run then goes on from the present random state."""
    if len(saved["cpu"]) != group.world_size:
        logger.warning("gradinit: the saved random state is of %d ranks, this run has %d: the resumed run draws "
                       "other dropout masks than an uninterrupted one", len(saved["cpu"]), group.world_size)
        return False
    cpu, cuda = saved["cpu"][group.rank], saved["cuda"][group.rank]
    missing = [i for i in _cuda_indices(tensors) if i not in cuda]
    if missing:
        logger.warning("gradinit: the saved random state has no state of cuda:%d (saved on another device): the "
                       "resumed run draws other dropout masks than an uninterrupted one", missing[0])
        return False
    try:
        torch.set_rng_state(cpu)
        for index, state in cuda.items():
            if index < torch.cuda.device_count():
                torch.cuda.set_rng_state(state, index)
    except RuntimeError as e:  # a tensor of another size than a generator's state
        raise ValueError(f"its random state cannot be set ({e})") from None
    return True
