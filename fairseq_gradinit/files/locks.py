"""One writer per output folder at a time: the advisory lock every command that writes a folder holds.

Two commands started into the same folder would otherwise build in it together: one deletes the other's
live partial build as "left by an interrupted run", or both write their files and one run's files are
left, mixed with the other's. The lock is an ``flock`` on a lock file that holds the owner's pid and host
for the refusal message; the operating system releases an ``flock`` when its process dies, so a lock
file left by a killed command is taken over without a question, and a command that ends normally removes
the file. The lock of a folder that the command creates only later (a build moved into place when it
is done, a run folder created when its first epoch ends) lies beside it: ``.NAME.lock`` in its parent
(:func:`folder_lock`); the fairseq plugin's ``--save-dir`` lock lies inside the folder
(:func:`take_lock` with its own path).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from typing import Callable, Iterator, List, Optional, Tuple

logger = logging.getLogger(__name__)


class FolderBusy(RuntimeError):
    """Another live process holds the lock; the message names it and says what to do."""


def lock_owner(path: str) -> str:
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


def take_lock(path: str, *, busy: Callable[[str], str], log_prefix: str = "") -> Optional[Tuple[str, int]]:
    """(``path``, descriptor) with ``path``'s lock taken (its folder must exist); None where the file
    system has no ``flock`` (logged). Raises :class:`FolderBusy` with ``busy(owner)`` when another live
    process holds it; ``OSError`` when the lock file cannot be created."""
    try:
        fd = _try_lock(path)
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        logger.warning("%sWARNING: cannot lock %s (%s); a second run into this folder would not be detected",
                       log_prefix, path, e.strerror or e)
        return None
    if fd is None:
        raise FolderBusy(busy(lock_owner(path)))
    previous = os.read(fd, 200).decode(errors="replace").split()
    if previous and previous[0] != str(os.getpid()):
        logger.info("%stook over %s, left by pid %s (a run that ended without removing it)", log_prefix, path,
                    previous[0])
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return path, fd


def release_lock(path: str, fd: int) -> None:
    with contextlib.suppress(OSError):  # removed before it is unlocked: see _try_lock
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.close(fd)


def lock_path(folder: os.PathLike) -> str:
    """The lock file of ``folder``: ``.NAME.lock`` beside it (it may not exist yet)."""
    folder = os.path.abspath(os.fspath(folder))
    return os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.lock")


def _missing_parents(path: str) -> List[str]:
    missing = []
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


@contextlib.contextmanager
def folder_lock(folder: os.PathLike, *, flag: str, command: str) -> Iterator[None]:
    """Hold the lock of the output folder ``folder`` (given as ``flag``) for the ``with`` block.

    Another live ``command`` writing there ends this one before any work: :class:`FolderBusy` (a
    ``RuntimeError``) with one line that names it. Folders created to hold the lock file are removed again
    when they are left empty, so a command that stops early leaves nothing behind."""
    path = lock_path(folder)
    created = _missing_parents(os.path.dirname(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def busy(owner: str) -> str:
        return (f"{flag} {folder}: another {command} ({owner}) is writing there (it holds {path}); two runs into one "
                f"folder would replace each other's files. Wait until it has finished, or give {flag} another path")

    try:
        taken = take_lock(path, busy=busy, log_prefix=f"{command}: ")
    except BaseException:
        _remove_empty(created)
        raise
    try:
        yield
    finally:
        if taken is not None:
            release_lock(*taken)
        _remove_empty(created)


def _remove_empty(folders: List[str]) -> None:
    for folder in folders:  # deepest first
        with contextlib.suppress(OSError):
            os.rmdir(folder)
