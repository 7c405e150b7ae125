"""One run per ``--save-dir`` at a time: an advisory lock held for the whole ``fairseq-train`` run.

Two runs started into the same folder would otherwise both compute GradInit, overwrite each
other's ``gradinit.json``, or resume each other's checkpoint and both write ``checkpoint_last.pt``.
A run with ``--gradinit-iters`` or ``--gradinit-init-file`` takes the lock when its criterion is
built (before the resume check, Admin's profiling and GradInit) and keeps it until its process ends.
The lock is an ``flock`` on ``<save-dir>/.gradinit.lock``, which holds the owner's pid and host for
the refusal message. The operating system releases an ``flock`` when its process dies, so a lock
file left by a killed run is taken over without a question; a process that ends normally removes
the file.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
from typing import Dict, Iterator, Optional

from ...files.locks import FolderBusy, release_lock, take_lock
from ..errors import GradInitError

logger = logging.getLogger(__name__)

LOCK_NAME = ".gradinit.lock"


#: The save dirs this process holds for the rest of its life: their real path -> (path, lock descriptor).
_HELD: Dict[str, tuple] = {}


class SaveDirBusy(RuntimeError):
    """Another live process holds the lock of the folder; the message names it."""


def _take(directory: str) -> Optional[tuple]:
    """(lock path, descriptor) of ``directory``'s lock, taken (the folder created if needed); None where
    the filesystem has no ``flock`` (logged). Raises :class:`SaveDirBusy` when another process holds it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)

    def busy(owner: str) -> str:
        return (f"another run ({owner}) is training in {directory} (it holds {path}); two runs into one "
                "--save-dir would overwrite each other's gradinit.json and checkpoints. Wait until it has finished, "
                "or use another --save-dir")

    try:
        return take_lock(path, busy=busy, log_prefix="gradinit: ")
    except FolderBusy as e:
        raise SaveDirBusy(str(e)) from None
    except OSError as e:
        logger.warning("gradinit: WARNING: cannot lock %s (%s); a second run into this folder would not be "
                       "detected", path, e.strerror or e)
        return None


_release = release_lock


@contextlib.contextmanager
def save_dir_lock(directory: str) -> Iterator[None]:
    """Hold ``directory``'s lock for the ``with`` block (:class:`SaveDirBusy` when another process
    holds it; a filesystem without ``flock`` support is logged and the block runs unlocked)."""
    taken = _take(directory)
    try:
        yield
    finally:
        if taken is not None:
            _release(*taken)


def release_save_dirs() -> None:
    """Give back every save dir this process holds (at exit; or when a caller that ran
    ``fairseq-train``'s ``main`` in its own process knows that run has ended)."""
    while _HELD:
        _release(*_HELD.popitem()[1])


def _release_at_exit() -> None:
    """:func:`release_save_dirs` when the process ends, with Ctrl-C ignored meanwhile: a second Ctrl-C right
    after the one that stopped the run (the shell sends one per key press) must not end in an "Exception
    ignored in atexit callback ... KeyboardInterrupt" traceback. A lock whose release it cut short is given
    back by the operating system with the process, and its file is taken over by the next run."""
    previous = None
    try:
        try:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass
        release_save_dirs()
    except KeyboardInterrupt:  # arrived before SIGINT was ignored: finish the release quietly
        with contextlib.suppress(KeyboardInterrupt, OSError):
            release_save_dirs()
    finally:
        if previous is not None:
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGINT, previous)


atexit.register(_release_at_exit)


def hold_save_dir(directory: str, *, rank: int = 0, world: int = 1) -> None:
    """Take ``directory``'s lock on rank 0 for all ranks (they share the folder) and keep it until this
    process ends: the whole run, its GradInit phase and its training. Taking it again is a no-op. A
    process runs one ``fairseq-train`` at a time, so a lock it holds on another folder belongs to a run
    that has ended, and is given back. When another run holds it, every rank stops with
    :class:`~..errors.GradInitError` (one line, exit status 1, :mod:`..errors`) before any work."""
    error = None
    key = os.path.realpath(directory)
    if rank == 0 and key not in _HELD:
        release_save_dirs()
        try:
            taken = _take(directory)
            if taken is not None:
                _HELD[key] = taken
        except SaveDirBusy as e:
            error = str(e)
        except OSError as e:  # a file in the way, no permission: before any work, not after it
            error = (f"--save-dir {directory}: cannot create or write it ({e.strerror or e}); GradInit's result "
                     "and the checkpoints go there: give a writable folder")
    if world > 1:
        import torch.distributed as dist

        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise GradInitError(error)
