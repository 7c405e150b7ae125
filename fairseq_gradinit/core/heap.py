"""Freed CPU memory kept mapped while a phase runs (glibc).

Each GradInit iteration on a CPU allocates and frees its passes' activations, a constraint iteration
its second-order graph too: far above glibc's trim threshold, and in tensors above its mmap
threshold. glibc then hands the memory back to the kernel at the end of each pass, and the next one
takes it again page by page, a page fault each. During the phase, the thresholds are set so that freed memory
stays in the heap; after it, to the values glibc's own adjustment reaches after freeing large blocks
(mmap threshold 32 MiB, trim threshold twice that), and the free memory goes back to the kernel.
Elsewhere than on Linux with glibc, and for models not on the CPU, nothing changes.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from typing import Iterator, Optional

import torch

#: mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: glibc's upper bound of its dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX);
#: its dynamic trim threshold is twice the mmap threshold
GLIBC_MMAP_MAX = 32 * 2 ** 20
#: "never": the largest value mallopt takes (an int)
_NEVER = 2 ** 31 - 1


def _glibc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        return libc
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def heap_kept(device: torch.device) -> Iterator[bool]:
    """Inside, freed memory stays mapped when ``device`` is a CPU and the C library is glibc; yields
    whether it does. Outside again: the thresholds glibc's adjustment converges to, and the free memory
    returned (``malloc_trim``), also when the body raises."""
    libc = _glibc() if torch.device(device).type == "cpu" else None
    if libc is None:
        yield False
        return
    libc.mallopt(M_TRIM_THRESHOLD, _NEVER)
    libc.mallopt(M_MMAP_THRESHOLD, _NEVER)
    try:
        yield True
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_MAX)
        libc.malloc_trim(0)
