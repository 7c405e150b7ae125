"""Batches built ahead of the iteration that uses them and copied to the device without a host sync."""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator, Optional, Union

import torch

_DONE = object()


def move_to_device(batch: Any, device: Union[str, torch.device], *, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor on ``device`` (nested dicts, lists, tuples, namedtuples)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)((k, move_to_device(v, device, non_blocking=non_blocking)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking=non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device, non_blocking=non_blocking) for v in batch)
    return batch


def pin(batch: Any) -> Any:
    """``batch`` with every CPU tensor in page-locked memory (what a non-blocking copy needs)."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" and not batch.is_pinned() else batch
    if isinstance(batch, dict):
        return type(batch)((k, pin(v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pin(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin(v) for v in batch)
    return batch


def _put(out: "queue.Queue", stop: threading.Event, value) -> bool:
    """Put ``value`` unless ``stop`` is set first; whether it was put."""
    while not stop.is_set():
        try:
            out.put(value, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _produce(source: Iterator[Any], out: "queue.Queue", stop: threading.Event, pinned: bool) -> None:
    try:
        for item in source:
            if not _put(out, stop, (pin(item) if pinned else item, None)):
                return
        _put(out, stop, (_DONE, None))
    except BaseException as e:  # handed to the consumer, which raises it
        _put(out, stop, (_DONE, e))


class DevicePrefetcher:
    """An iterator over ``items`` moved to ``device``, each built while earlier ones are in use.

    A background thread draws up to ``depth`` items from ``items`` ahead of the consumer (for
    CUDA it also pins their tensors), so building a batch on the host overlaps the GPU's work,
    including the time the consumer waits for the GPU. Items are copied to ``device`` when taken,
    on the current stream with ``non_blocking`` from pinned memory: the copy is queued behind the
    work already issued and the host does not wait for it. ``thread`` defaults to on for CUDA
    devices (on a CPU the passes and the builder would only compete for the same cores). Items
    keep their order; an exception of ``items`` is raised by ``next``. Close it (or use it as a
    context manager) to stop the thread; an abandoned prefetcher stops it when collected.
    """

    def __init__(self, items: Iterable[Any], device: Union[str, torch.device], *, depth: int = 2,
                 thread: Optional[bool] = None):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth={depth!r} is invalid: expected an integer >= 1")
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.non_blocking = cuda
        self._source = iter(items)
        self._stop = threading.Event()
        self._queue: Optional[queue.Queue] = None
        self._thread: Optional[threading.Thread] = None
        self._finished = False
        if cuda if thread is None else thread:
            self._queue = queue.Queue(maxsize=depth)
            # The thread holds no reference to self, so an abandoned prefetcher is collected and stops it.
            self._thread = threading.Thread(target=_produce, args=(self._source, self._queue, self._stop, cuda),
                                            name="gradinit-prefetch", daemon=True)
            self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        if self._queue is None:
            try:
                item = next(self._source)
            except StopIteration:
                self._finished = True
                raise
        else:
            item, error = self._queue.get()
            if item is _DONE:
                self._finished = True
                self.close()
                if error is not None:
                    raise error
                raise StopIteration
        return move_to_device(item, self.device, non_blocking=self.non_blocking)

    def close(self) -> None:
        """Stop the background thread (items drawn ahead are dropped)."""
        self._finished = True
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def __enter__(self) -> "DevicePrefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
