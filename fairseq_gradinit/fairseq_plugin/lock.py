"""One GradInit phase per ``--save-dir`` at a time: an advisory lock held for the whole phase.

Two runs started into the same folder would otherwise both compute GradInit, overwrite each
other's ``gradinit.json`` and then train on each other's checkpoints. The lock is an ``flock`` on
``<save-dir>/.gradinit.lock``, which holds the owner's pid and host for the refusal message. The
operating system releases an ``flock`` when its process dies, so a lock file left by a killed run
is taken over without a question; a run that ends normally removes the file.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from typing import Iterator, Optional

from .option_values import GradInitStop

logger = logging.getLogger(__name__)

LOCK_NAME = ".gradinit.lock"


class SaveDirBusy(RuntimeError):
    """Another live process holds the GradInit lock of the folder; the message names it."""


def _owner(path: str) -> str:
    """'pid N on host H' as written by the holder (it writes right after taking the lock)."""
    for _ in range(20):
        try:
            with open(path) as f:
                text = f.read().split()
        except OSError:
            text = []
        if len(text) >= 2:
            return f"pid {text[0]} on host {text[1]}"
        time.sleep(0.05)
    return "a process whose pid it has not written yet"


def _try_lock(path: str) -> Optional[int]:
    """An open descriptor of ``path`` holding its ``flock``, or None while another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        # The holder removes the file before it unlocks: a lock on a removed file is no lock.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def save_dir_lock(directory: str) -> Iterator[None]:
    """Hold ``directory``'s GradInit lock (created with the folder if needed) for the ``with`` block.

    Raises :class:`SaveDirBusy` when another process holds it. A filesystem without ``flock``
    support is logged and the block runs unlocked.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    try:
        fd = _try_lock(path)
    except OSError as e:
        logger.warning("gradinit: WARNING: cannot lock %s (%s); a second run into this folder would not be "
                       "detected", path, e.strerror or e)
        yield
        return
    if fd is None:
        raise SaveDirBusy(
            f"another run ({_owner(path)}) is in its GradInit phase in {directory} (it holds {path}); two runs into "
            "one --save-dir would overwrite each other's gradinit.json and checkpoints. Wait until it has finished, "
            "or use another --save-dir")
    previous = os.read(fd, 200).decode(errors="replace").split()
    if previous and previous[0] != str(os.getpid()):
        logger.info("gradinit: took over %s, left by pid %s (a run that ended without removing it)", path,
                    previous[0])
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def phase_lock(directory: str, *, rank: int = 0, world: int = 1) -> Iterator[None]:
    """:func:`save_dir_lock` held by rank 0 for all ranks (they share the folder); when another run
    holds it, every rank stops with :class:`~.option_values.GradInitStop` (one line, exit status 1)."""
    with contextlib.ExitStack() as stack:
        error = None
        if rank == 0:
            try:
                stack.enter_context(save_dir_lock(directory))
            except SaveDirBusy as e:
                error = str(e)
            except OSError as e:  # a file in the way, no permission: before the phase, not after it
                error = (f"--save-dir {directory}: cannot create or write it ({e.strerror or e}); GradInit's result "
                         "and the checkpoints go there: give a writable folder")
        if world > 1:
            import torch.distributed as dist

            box = [error]
            dist.broadcast_object_list(box, src=0)
            error = box[0]
        if error is not None:
            raise GradInitStop(error)
        yield
