"""PyTorch's CPU threads for a GradInit run on the CPU when the user chose none.

PyTorch starts one thread per core. Its threads wait for each other at every operator, so when another
program keeps a core busy, a run with one thread per core is slower than one with a thread per free
core (docs/fairseq.md#cpu-threads has the measurement). When ``OMP_NUM_THREADS`` is not set, the plugin
counts the cores that other programs keep busy as the run starts and uses one thread per free core;
on an idle machine that is PyTorch's own default, so nothing changes there.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Mapping, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

#: How long the cores' busy time is sampled before the run starts.
SAMPLE_SECONDS = 0.3
#: A core counts as busy when other programs use at least this share of it over the sample.
BUSY_SHARE = 0.6


def cpu_times(stat_text: str) -> Optional[Tuple[float, float]]:
    """(busy, total) jiffies of all cores from the text of ``/proc/stat``; None if it has no ``cpu`` line."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [float(v) for v in fields[1:]]
            idle = sum(values[3:5])  # idle and iowait
            # guest times are already counted in user and nice
            total = sum(values[:8])
            return total - idle, total
    return None


def busy_cores(before: str, after: str, cores: int) -> Optional[float]:
    """How many of ``cores`` other programs kept busy between two readings of ``/proc/stat``."""
    a, b = cpu_times(before), cpu_times(after)
    if a is None or b is None or b[1] <= a[1]:
        return None
    return cores * (b[0] - a[0]) / (b[1] - a[1])


def threads_for(*, env: Mapping[str, str], cores: int, current: int, busy: Optional[float]) -> Optional[int]:
    """The thread count to set, or None to leave PyTorch's: only when ``OMP_NUM_THREADS`` is unset, the
    busy share is known, and fewer threads than ``current`` leaves one per free core (at least one)."""
    if env.get("OMP_NUM_THREADS", "").strip() or busy is None or cores < 2:
        return None
    free = max(1, cores - int(busy + (1 - BUSY_SHARE)))
    return free if free < current else None


def sample_busy_cores(cores: int, seconds: float = SAMPLE_SECONDS, path: str = "/proc/stat") -> Optional[float]:
    """Cores kept busy by other programs over ``seconds`` (this process sleeps meanwhile); None where
    the system has no ``/proc/stat``."""
    try:
        with open(path) as f:
            before = f.read()
        time.sleep(seconds)
        with open(path) as f:
            after = f.read()
    except OSError:
        return None
    return busy_cores(before, after, cores)


def choose_cpu_threads(*, on_cpu: bool, env: Optional[Mapping[str, str]] = None,
                       sample: Optional[Sequence[float]] = None) -> Optional[int]:
    """Set PyTorch's CPU threads for a run on the CPU (``on_cpu``) as the module says; returns the
    count set, or None when PyTorch's stays. ``sample`` gives the busy cores instead of measuring them."""
    import torch

    if not on_cpu:
        return None
    env = os.environ if env is None else env
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    current = torch.get_num_threads()
    if env.get("OMP_NUM_THREADS", "").strip() or current < 2:
        return None
    busy = sample[0] if sample is not None else sample_busy_cores(cores)
    threads = threads_for(env=env, cores=cores, current=current, busy=busy)
    if threads is None:
        return None
    torch.set_num_threads(threads)
    logger.info("gradinit: PyTorch uses %d CPU thread%s instead of %d: other programs kept %.1f of the %d cores "
                "busy as the run started (OMP_NUM_THREADS sets the count yourself)",
                threads, "" if threads == 1 else "s", current, busy, cores)
    return threads
