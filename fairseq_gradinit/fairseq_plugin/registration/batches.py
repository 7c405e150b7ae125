"""The task's training data as a run's (S, S~) pairs: the batch factory the task binds into the run it
hands the phase (:class:`~..phase.run.GradInitRun`), so that the phase draws batches without the task."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...core import BatchPair, DevicePrefetcher
from ...core.batching import authors_rows, split_draw
from ..data.training import collate, slice_sample, training_batch_indices, training_dataset
from ..settings.plan import GradInitPlan


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
    (:func:`~..data.training.slice_sample`: the padded width of the whole batch kept). Pairs are
    collated on the host ahead of the iteration that uses them (:class:`DevicePrefetcher`; close
    it when done) and, on CUDA, copied from pinned memory without waiting for the GPU. The first
    ``skip`` pairs are passed over without collating them (a resumed phase).
    """
    dataset = training_dataset(task, plan.train_subset)
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
