"""Forming the batch pairs (S, S~) that GradInit evaluates."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Tuple

import torch


class BatchPair(NamedTuple):
    """S, the batch the gradient is taken on, and S~, the batch the loss after the step is taken on."""

    s: Any
    s_tilde: Any


def batch_size(batch: Any) -> int:
    """Number of examples of a batch of tensors (first dimension of its first tensor)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        for v in batch.values():
            try:
                return batch_size(v)
            except ValueError:
                continue
    if isinstance(batch, (list, tuple)):
        for v in batch:
            try:
                return batch_size(v)
            except ValueError:
                continue
    raise ValueError(
        f"cannot find a tensor in a batch of type {type(batch).__name__}; pass ready-made "
        "BatchPair items or custom `split`/`concat` functions"
    )


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor in a (nested) batch; other leaves are kept as they are."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return type(batch)((k, slice_batch(v, start, stop)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(slice_batch(v, start, stop) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(slice_batch(v, start, stop) for v in batch)
    return batch


def concat_batches(a: Any, b: Any) -> Any:
    """Concatenate two batches of the same structure along the first dimension."""
    if isinstance(a, torch.Tensor):
        return torch.cat([a, b.to(a.device)], dim=0)
    if isinstance(a, dict):
        return type(a)((k, concat_batches(a[k], b[k])) for k in a)
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return type(a)(*(concat_batches(x, y) for x, y in zip(a, b)))
    if isinstance(a, (list, tuple)):
        return type(a)(concat_batches(x, y) for x, y in zip(a, b))
    return a


def tilde_rows(size_s: int, overlap: float) -> Tuple[int, int]:
    """Where S~ lies in a sequence of examples whose first ``size_s`` are S: ``size_s`` rows that
    start ``round(overlap * size_s)`` rows before S ends, so that ``|S ∩ S~| = overlap·|S|`` (the
    one meaning of ``overlap``; rows past the sequence's end are simply missing)."""
    k = int(round(overlap * size_s))
    return size_s - k, 2 * size_s - k


def split_draw(n: int, overlap: float) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Rows of S and of S~ in one draw of ``n`` examples: S is the first 1/(2-overlap) of it and
    S~ (:func:`tilde_rows`) the rest plus the shared part, e.g. thirds for overlap 0.5. A draw of
    fewer than 2 examples (or one S~ gets nothing of) serves as both."""
    if n < 2:
        return (0, n), (0, n)
    size_s = min(n, max(1, int(round(n / (2.0 - overlap)))))
    start, stop = tilde_rows(size_s, overlap)
    if start >= n:
        return (0, size_s), (0, size_s)
    return (0, size_s), (start, min(stop, n))


def overlapping_pairs(
    batches: Iterable[Any],
    overlap: float = 0.5,
    *,
    split: Optional[Callable[[Any, int, int], Any]] = None,
    concat: Optional[Callable[[Any, Any], Any]] = None,
) -> Iterator[BatchPair]:
    """Turn a stream of batches b0, b1, ... into pairs (S, S~) with ``|S ∩ S~| = overlap·|S|``.

    Pair t uses S = b_t and S~ = (last ``overlap`` part of b_t) + (first part of b_{t+1}), so S and
    S~ have the same size, every batch serves once as S, and N batches give N-1 pairs (one pass
    over a data loader is one GradInit epoch). ``split(batch, start, stop)`` and ``concat(a, b)``
    default to row slicing and ``torch.cat`` on every tensor of a (nested) batch.
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap={overlap!r} is invalid: expected a number in [0, 1]")
    split = split or slice_batch
    concat = concat or concat_batches
    it = iter(batches)
    try:
        prev = next(it)
    except StopIteration:
        return
    if overlap >= 1.0:
        yield BatchPair(prev, prev)
        for b in it:
            yield BatchPair(b, b)
        return
    for nxt in it:
        n = batch_size(prev)
        start, stop = tilde_rows(n, overlap)  # S~ runs on into the next batch
        k, m = n - start, min(stop - n, batch_size(nxt))
        if k == 0:
            s_tilde = split(nxt, 0, m)
        elif m == 0:
            s_tilde = split(prev, n - k, n)
        else:
            s_tilde = concat(split(prev, n - k, n), split(nxt, 0, m))
        yield BatchPair(prev, s_tilde)
        prev = nxt


def authors_rows(n: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Rows of S and of S~ in one batch of ``n`` rows as the authors' fairseq code forms them: with
    k = n // 3, S = rows [0, 2k) and S~ = rows [k, n) (S~ has the n - 2k rows left over, too). A
    batch of fewer than 3 rows (k = 0 would leave S empty) serves as both."""
    k = n // 3
    if k == 0:
        return (0, n), (0, n)
    return (0, 2 * k), (k, n)


def authors_pairs(batches: Iterable[Any], *, split: Optional[Callable[[Any, int, int], Any]] = None
                  ) -> Iterator[BatchPair]:
    """One pair per batch, S and S~ the rows :func:`authors_rows` of that batch in the order it holds
    them (``split(batch, start, stop)`` defaults to row slicing of every tensor)."""
    split = split or slice_batch
    for b in batches:
        (a, c), (d, e) = authors_rows(batch_size(b))
        yield BatchPair(split(b, a, c), split(b, d, e))


def cycle_iterable(batches: Iterable[Any]) -> Iterator[Any]:
    """Iterate ``batches`` repeatedly when it can be re-iterated (e.g. a DataLoader), else once."""
    it = iter(batches)
    if it is batches:
        yield from it
        return
    empty = True
    for b in it:
        empty = False
        yield b
    if empty:
        return
    for _ in itertools.count():
        yield from iter(batches)
