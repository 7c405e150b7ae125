"""One GradInit run, resolved before the phase starts: :class:`GradInitRun`.

The task (:class:`~.hook.GradInitTaskMixin`) builds it once, when its criterion exists, from what
only the task knows (its training data, its config, the model's arguments as given, the cuDNN
attention guard's decision), and hands it to the phase (:mod:`.compute`). The phase reads the run and
the model and returns its result; it never sees the task, so data flows one way: fairseq to the task
to the run to the phase.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch.distributed as dist

from ...core import BatchPair, DevicePrefetcher
from ...core.batching import authors_rows, split_draw
from ..data.cfg import cfg_value
from .state import state_path
from ..settings.plan import GradInitPlan
from ..data.training import collate, slice_sample, training_batch_indices, training_dataset

#: The file of a run's scales in ``--save-dir`` (never overwritten).
GRADINIT_JSON = "gradinit.json"


def rank_world():
    """(this process's rank, the number of ranks): (0, 1) outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclasses.dataclass(frozen=True)
class GradInitRun:
    """Everything the phase needs, and nothing of the task: built once per run.

    ``pairs(model, max_tokens, overlap, device, rank=0, world=1, skip=0)`` gives the endless (S, S~)
    pairs of this rank (:func:`gradinit_pairs` of the task, bound to it); ``loss_fn(model, sample)``
    the mean loss GradInit differentiates and ``criterion(model, sample)`` fairseq's criterion (the
    health check runs both); ``valid_split_error(model)`` fairseq's refusal of the validation split,
    found before the phase (None: none). ``fingerprint`` is rank 0's (None on the other ranks).
    """

    plan: GradInitPlan
    fingerprint: Optional[Mapping[str, Any]]
    pairs: Callable[..., DevicePrefetcher]
    loss_fn: Callable
    criterion: Callable
    valid_split_error: Callable[[Any], Optional[str]]
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


def gradinit_pairs(task, model, max_tokens: int, overlap: float, device, rank: int = 0,
                   world: int = 1, skip: int = 0, *, plan: GradInitPlan) -> DevicePrefetcher:
    """Endless (S, S~) pairs on ``device`` from this rank's shard of ``task``'s training data, as
    the run's ``plan`` says (its seed, ``--batch-size``, training split and ``--gradinit-pairs``).

    Each pair is one batch of the task's own training iterator with ``max_tokens`` tokens (and
    the run's ``--batch-size``; over-long samples skipped as fairseq-train skips them); its
    samples are shuffled and split so S and S~ each hold 1/(2-overlap) of it and share
    ``overlap`` of S (thirds for overlap 0.5). Each half is collated by the dataset, so every field
    of the sample (``net_input``, ``target``, ``ntokens``, ``nsentences``, ...) describes exactly
    its samples, whatever the task. With ``--gradinit-pairs authors`` (the authors' fairseq code)
    the batch is collated whole, its samples in the dataset collater's order (a translation batch
    sorted by source length, longest first), and S and S~ are its rows :func:`~..core.batching.authors_rows`
    (:func:`~.training.slice_sample`: the padded width of the whole batch kept). Pairs are
    collated on the host ahead of the iteration that uses them (:class:`DevicePrefetcher`; close
    it when done) and, on CUDA, copied from pinned memory without waiting for the GPU. The first
    ``skip`` pairs are passed over without collating them (a resumed phase).
    """
    dataset = training_dataset(task, plan.train_subset or cfg_value(task.gradinit_cfg, "train_subset"))
    seed = plan.seed
    authors = plan.config is not None and plan.config.pairs == "authors"
    pad = task.target_dictionary.pad() if authors and task.target_dictionary is not None else 1
    batches = training_batch_indices(task, model, dataset, max_tokens=max_tokens,
                                     batch_size=plan.train_batch_size, seed=seed)
    if len(batches) < world:
        raise ValueError(f"the training set has {len(batches)} batches of {max_tokens} tokens, fewer than "
                         f"there are ranks ({world}): each rank needs its own; lower --gradinit-max-tokens")

    skipped = [0]

    def gen():
        epoch = 0
        while True:
            epoch += 1
            rng = np.random.RandomState((seed + 7919 * epoch) % (2 ** 32))
            shard = [batches[i] for i in rng.permutation(len(batches))][rank::world]
            for idx in shard:
                idx = idx if authors else idx[rng.permutation(len(idx))]
                if skipped[0] < skip:
                    skipped[0] += 1
                    continue
                if authors:
                    whole = collate(dataset, idx, "cpu")
                    (a, b), (c, d) = authors_rows(len(idx))
                    yield BatchPair(slice_sample(whole, a, b, pad), slice_sample(whole, c, d, pad))
                    continue
                (a, b), (c, d) = split_draw(len(idx), overlap)
                s_idx, st_idx = idx[a:b], idx[c:d]
                yield BatchPair(collate(dataset, s_idx, "cpu"), collate(dataset, st_idx, "cpu"))

    return DevicePrefetcher(gen(), device)


def batch_factory(task, plan: GradInitPlan) -> Callable[..., DevicePrefetcher]:
    """:func:`gradinit_pairs` of ``task`` under ``plan``, as ``pairs(model, max_tokens, overlap, device,
    rank=0, world=1, skip=0)``."""

    def pairs(model, max_tokens: int, overlap: float, device, rank: int = 0, world: int = 1,
              skip: int = 0) -> DevicePrefetcher:
        return gradinit_pairs(task, model, max_tokens, overlap, device, rank, world, skip, plan=plan)

    return pairs
