"""Freed CPU memory kept mapped while a phase runs (glibc), opt-in: ``GRADINIT_HEAP_TUNING=1``.

Each GradInit iteration on a CPU allocates and frees its passes' activations, a constraint iteration
its second-order graph too: far above glibc's trim threshold, and in tensors above its mmap
threshold. glibc then hands the memory back to the kernel at the end of each pass, and the next one
takes it again page by page, a page fault each. With the variable set, the thresholds are set during the phase
so that freed memory stays in the heap; after it, to the values glibc's own adjustment reaches after freeing
large blocks (mmap threshold 32 MiB, trim threshold twice that), and the free memory goes back to the kernel.

Off by default: it changes the whole process's allocator, and in the stored benchmark the phase's cost
relative to a training update did not move with it (benchmarks/README.md). It also stays off where the user
set glibc's thresholds themselves (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, or the
``glibc.malloc`` tunables), elsewhere than on Linux with glibc, and for models not on the CPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys
from typing import Iterator, Mapping, Optional

import torch

logger = logging.getLogger(__name__)

#: The environment variable that turns the tuning on (``1``).
ENV = "GRADINIT_HEAP_TUNING"
#: mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: glibc's upper bound of its dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX);
#: its dynamic trim threshold is twice the mmap threshold
GLIBC_MMAP_MAX = 32 * 2 ** 20
#: "never": the largest value mallopt takes (an int)
_NEVER = 2 ** 31 - 1
#: The user's own settings of the thresholds this module would change: environment variables, and the
#: names of the same settings in ``GLIBC_TUNABLES``.
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold")


def _glibc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc


def user_settings(environ: Mapping[str, str]) -> list:
    """The user's own settings of glibc's thresholds in ``environ`` (names), which the tuning leaves alone."""
    found = [name for name in USER_SETTINGS if name in environ]
    tunables = environ.get("GLIBC_TUNABLES", "")
    return found + [name for name in _TUNABLES if name in tunables]


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``GRADINIT_HEAP_TUNING=1`` asks for the tuning (whether it applies is :func:`heap_kept`'s)."""
    return environ.get(ENV, "").strip() == "1"


def _set(libc, param: int, value: int) -> bool:
    """mallopt, its failure (a return of 0) logged."""
    if libc.mallopt(param, value) == 1:
        return True
    logger.warning("gradinit: mallopt(%d, %d) failed; glibc's thresholds left as they are", param, value)
    return False


@contextlib.contextmanager
def heap_kept(device: torch.device, environ: Mapping[str, str] = os.environ) -> Iterator[bool]:
    """Inside, freed memory stays mapped when the tuning is asked for (``GRADINIT_HEAP_TUNING=1``), ``device`` is
    a CPU, the C library is glibc and the user set no threshold of their own; yields whether it does. Outside
    again: the thresholds glibc's adjustment converges to, and the free memory returned (``malloc_trim``), also
    when the body raises."""
    libc = None
    if enabled(environ) and torch.device(device).type == "cpu":
        own = user_settings(environ)
        if own:
            logger.info("gradinit: %s=1 ignored: glibc's thresholds are the user's (%s)", ENV, ", ".join(own))
        else:
            libc = _glibc()
    if libc is None:
        yield False
        return
    if not _set(libc, M_TRIM_THRESHOLD, _NEVER):  # nothing changed: nothing to set back
        yield False
        return
    kept = _set(libc, M_MMAP_THRESHOLD, _NEVER)
    try:
        yield kept
    finally:
        _set(libc, M_MMAP_THRESHOLD, GLIBC_MMAP_MAX)
        _set(libc, M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_MAX)
        libc.malloc_trim(0)
