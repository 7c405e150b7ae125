"""Progress of an iteration loop: when to log (every N iterations and every T seconds of wall time), how
long is left, and what the end of a GradInit run should tell the user."""
from __future__ import annotations

import math
import time
from typing import Callable, Optional, Sequence

from .errors import OptionNamer, keyword_name


def format_duration(seconds: float) -> str:
    """Seconds under a minute as ``<s>s``, under an hour as ``<m>m<ss>s``, else ``<h>h<mm>m`` (rounded)."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class ProgressClock:
    """Decides when an iteration loop logs: at the first iteration, every ``every_iters`` iterations and,
    when ``every_seconds`` > 0, whenever that much wall time has passed since the last line."""

    def __init__(self, *, every_iters: int, every_seconds: float = 0.0,
                 clock: Optional[Callable[[], float]] = None, first: int = 0):
        #: iterations done before this clock started (a resumed run): the ETA counts only those after
        self.first = first
        self.every_iters = every_iters
        self.every_seconds = every_seconds
        self.clock = clock or time.monotonic
        self.start = self.last_time = self.clock()

    def due(self, completed: int) -> Optional[str]:
        """Why a line is due after ``completed`` iterations: ``"iterations"``, ``"time"``, or ``None``."""
        if completed == 1 or completed % self.every_iters == 0:
            return "iterations"
        if self.every_seconds > 0 and self.clock() - self.last_time >= self.every_seconds:
            return "time"
        return None

    def timing(self, completed: int, total: Optional[int]) -> str:
        """``"<elapsed> elapsed, ETA <remaining>"`` in :func:`format_duration`'s form (no ETA without a total); the wall-time interval restarts now."""
        now = self.clock()
        elapsed = now - self.start
        self.last_time = now
        text = f"{format_duration(elapsed)} elapsed"
        if total and completed > self.first:
            text += f", ETA {format_duration(elapsed / (completed - self.first) * max(0, total - completed))}"
        return text


def no_objective_advice(branches: Sequence[str], grad_norms: Sequence[Optional[float]], gamma: float,
                        norm_p: int, option_name: OptionNamer = keyword_name) -> Optional[str]:
    """The warning a GradInit run deserves when no objective iteration ran (``None`` otherwise): every
    iteration only pushed ||g|| down towards gamma, so the loss after a step was never optimized. The options
    to change are named by ``option_name`` (a Python caller's keywords by default)."""
    if "objective" in branches or "constraint" not in branches:
        return None
    norms = [g for g, b in zip(grad_norms, branches) if b == "constraint" and g is not None and math.isfinite(g)]
    trend = f" (|g|_{norm_p} {norms[0]:.4g} -> {norms[-1]:.4g} against gamma {gamma:.4g})" if norms else ""
    n, skipped = branches.count("constraint"), branches.count("skipped")
    which = f" and {skipped} skipped" if skipped else ""
    # one line under 300 characters with the log's own prefix: what happened, then what to do
    return (f"gradinit: no objective iteration ran: {n} constraint iterations{which}{trend}, so the loss after one "
            f"step was never optimized; run more iterations ({option_name('iters')}) or raise gamma "
            f"({option_name('gamma')})")
