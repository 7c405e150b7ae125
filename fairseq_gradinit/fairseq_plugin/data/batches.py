"""A task's training data as a run's (S, S~) pairs: :class:`BatchSource`, the frozen data the task hands
the phase (in its :class:`~..phase.run.GradInitRun`), so that the phase draws batches without the task."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from ...core import BatchPair, DevicePrefetcher
from ...core.batching import authors_rows, split_draw
from .loss import SOURCE_CONTRAST_KEY, SOURCE_MARGIN_KEY
from .training import collate, slice_sample, training_batch_indices, training_dataset

#: How far apart the shuffle seeds of successive epochs are: epoch e shuffles with seed ``seed + e * stride``.
#: A large prime, so that each epoch's seed differs and two runs whose ``--seed`` differ by less than it never
#: replay each other's orders an epoch apart (with a stride of 1, seed 1's second epoch would be seed 2's first).
EPOCH_SEED_STRIDE = 7919


@dataclasses.dataclass(frozen=True)
class BatchSource:
    """A task's training batches as data: ``dataset`` (whose collater makes a sample), ``batches`` (the
    sample indices of each batch of the task's own training iterator, in its order), ``seed`` (the run's
    ``--seed``), ``authors`` (``--gradinit-pairs authors``: S and S~ are rows of one collated batch) and
    ``pad`` (the padding index whose tokens that cut does not count); ``max_tokens`` the tokens of each
    batch."""

    dataset: Any
    batches: Tuple[np.ndarray, ...]
    seed: int
    authors: bool = False
    pad: int = 1
    max_tokens: Optional[int] = None
    #: ``--gradinit-source-contrast``: S~ carries this weight (:data:`~.loss.SOURCE_CONTRAST_KEY`); 0: off.
    source_contrast: float = 0.0
    #: ``--gradinit-source-margin``: S~ carries it too (:data:`~.loss.SOURCE_MARGIN_KEY`); 0: the linear contrast.
    source_margin: float = 0.0

    def pairs(self, overlap: float, device, *, rank: int = 0, world: int = 1, skip: int = 0) -> DevicePrefetcher:
        """Endless (S, S~) pairs of this rank's shard on ``device``.

        Each pair is one batch, its samples shuffled and split so S and S~ each hold 1/(2-overlap) of it
        and share ``overlap`` of S (thirds for overlap 0.5). Each half is collated by the dataset, so every
        field of the sample (``net_input``, ``target``, ``ntokens``, ``nsentences``, ...) describes exactly
        its samples, whatever the task. With ``authors`` (the authors' fairseq code) the batch is collated
        whole, its samples in the dataset collater's order (a translation batch sorted by source length,
        longest first), and S and S~ are its rows :func:`~...core.batching.authors_rows`
        (:func:`~.training.slice_sample`: the padded width of the whole batch kept). Pairs are collated on
        the host ahead of the iteration that uses them (:class:`DevicePrefetcher`; close it when done) and,
        on CUDA, copied from pinned memory without waiting for the GPU. The first ``skip`` pairs are passed
        over without collating them (a resumed phase).
        """
        if len(self.batches) < world:
            raise ValueError(f"the training set has {len(self.batches)} batches of {self.max_tokens} tokens, fewer than there are ranks "
                             f"({world}): each rank needs its own; lower --gradinit-max-tokens")
        return DevicePrefetcher(self._draw(overlap, rank, world, skip), device)

    def _draw(self, overlap: float, rank: int, world: int, skip: int):
        dataset, batches, authors = self.dataset, self.batches, self.authors
        epoch = 0
        while True:
            epoch += 1
            rng = np.random.RandomState((self.seed + EPOCH_SEED_STRIDE * epoch) % (2 ** 32))
            shard = [batches[i] for i in rng.permutation(len(batches))][rank::world]
            for idx in shard:
                idx = idx if authors else idx[rng.permutation(len(idx))]
                if skip > 0:
                    skip -= 1
                    continue
                if authors:
                    whole = collate(dataset, idx, "cpu")
                    (a, b), (c, d) = authors_rows(len(idx))
                    yield BatchPair(slice_sample(whole, a, b, self.pad), self._marked(slice_sample(whole, c, d, self.pad)))
                    continue
                (a, b), (c, d) = split_draw(len(idx), overlap)
                yield BatchPair(collate(dataset, idx[a:b], "cpu"), self._marked(collate(dataset, idx[c:d], "cpu")))

    def _marked(self, s_tilde):
        """S~ as the objective scores it: with the source contrast's weight when it is on."""
        if not self.source_contrast or not isinstance(s_tilde, dict):
            return s_tilde
        marks = {SOURCE_CONTRAST_KEY: float(self.source_contrast)}
        if self.source_margin:
            marks[SOURCE_MARGIN_KEY] = float(self.source_margin)
        return {**s_tilde, **marks}


def batch_source(task, model, *, max_tokens: int, subset: Optional[str] = None, batch_size: Optional[int] = None,
                 seed: int = 1, authors: bool = False, source_contrast: float = 0.0,
                 source_margin: float = 0.0) -> BatchSource:
    """The :class:`BatchSource` of ``task``'s training split ``subset`` for ``model``: the batches of
    ``max_tokens`` tokens (and ``batch_size`` sentences) of the task's own training iterator, over-long
    samples skipped as fairseq-train skips them. ``ValueError`` when every sample is skipped."""
    dataset = training_dataset(task, subset)
    pad = task.target_dictionary.pad() if authors and task.target_dictionary is not None else 1
    batches = training_batch_indices(task, model, dataset, max_tokens=max_tokens, batch_size=batch_size, seed=seed)
    return BatchSource(dataset=dataset, batches=tuple(batches), seed=int(seed), authors=bool(authors), pad=int(pad),
                       max_tokens=max_tokens, source_contrast=float(source_contrast),
                       source_margin=float(source_margin))
