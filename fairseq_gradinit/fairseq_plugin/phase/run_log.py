"""What a ``fairseq-train`` run with GradInit says while it trains and when it ends.

fairseq prints training statistics every ``--log-interval`` updates, which can be many minutes apart (or
not at all before the run ends) when the output goes to a file. With GradInit on, the plugin adds a
progress line whenever ``--gradinit-progress-seconds`` of wall time have passed (update number, updates
per second, the mean loss since the last line, the time left to ``--max-update``) and, when the process
ends, one summary line of the GradInit phase read from ``gradinit.json`` (iterations by branch, health
verdict, where the files are).
The model printout and the full configuration that fairseq-train logs first go to the debug level
(:func:`quiet_fairseq_printouts`): they are the checkpoint's ``cfg`` and the model's ``repr``.
"""
from __future__ import annotations

import atexit
import json
import logging
import math
import os
import time
from typing import Callable, Optional

import torch

from ...command_line.quiet import LOG_LEVEL_ENV, quiet_printouts
from ...core.progress import format_duration

__all__ = ["LOG_LEVEL_ENV", "TrainingProgress", "progress_from_plan", "quiet_fairseq_printouts", "summarize_at_exit",
           "summary_line"]

logger = logging.getLogger(__name__)



class TrainingProgress:
    """A log line every ``every_seconds`` of wall time during training, from the task's ``train_step``.

    The loss is summed on the device and read once per line, so that training waits for the device no
    more often than that."""

    def __init__(self, every_seconds: float, clock: Optional[Callable[[], float]] = None, *,
                 max_update: Optional[int] = None):
        self.every_seconds = every_seconds
        #: --max-update (0 or None: no limit, no ETA)
        self.max_update = max_update or None
        self.clock = clock or time.monotonic
        self.start: Optional[float] = None
        self.last_time = 0.0
        self.last_update: Optional[int] = None
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.sample_size, self.updates = None, 0.0, set()

    def on_train_step(self, update_num: int, result, ignore_grad: bool) -> None:
        """Count one ``train_step`` (``result``: its ``(loss, sample_size, logging_output)``)."""
        now = self.clock()
        if self.start is None:
            self.start = self.last_time = now
            self.last_update = update_num
        loss, sample_size = (result[0], result[1]) if isinstance(result, tuple) and len(result) >= 2 else (None, 0)
        if not ignore_grad and torch.is_tensor(loss):
            loss = loss.detach().float()
            self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
            self.sample_size += float(sample_size)
        self.updates.add(update_num)
        if now - self.last_time >= self.every_seconds:
            logger.info(self.line(update_num + 1, now))

    def line(self, updates_done: int, now: float) -> str:
        """The progress line after ``updates_done`` updates; the interval restarts."""
        rate = (updates_done - self.last_update) / max(now - self.start, 1e-9)
        of = f"/{self.max_update}" if self.max_update else ""
        text = (f"gradinit: training progress: update {updates_done}{of}, {format_duration(now - self.start)} "
                f"elapsed, {rate:.3g} updates/s")
        if self.max_update and rate > 0:
            # at the mean rate since training started (validation and checkpoints not counted ahead)
            text += f", ETA {format_duration(max(0, self.max_update - updates_done) / rate)}"
        if self.loss_sum is not None and self.sample_size > 0:
            loss = float(self.loss_sum) / self.sample_size / math.log(2)
            n = len(self.updates)
            text += f", loss {loss:.4g} over the last {n} update{'' if n == 1 else 's'} (base 2, as fairseq's loss)"
        self.last_time = now
        self._reset()
        return text


def progress_from_plan(plan) -> Optional[TrainingProgress]:
    """The run's :class:`TrainingProgress`, or None when GradInit is off or the interval is 0."""
    if not plan.enabled or plan.progress_seconds <= 0:
        return None
    return TrainingProgress(plan.progress_seconds, max_update=plan.training.max_update)


def summary_line(result_path: str, save_dir: str) -> Optional[str]:
    """One line on the GradInit scales recorded in ``result_path`` (the run's ``gradinit.json`` or the init
    file it applied) and the files in ``save_dir``; None when the file cannot be read."""
    try:
        with open(result_path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    what = "scales"
    if isinstance(record.get("iterations"), int):
        what = (f"{record['iterations']} iterations ({record.get('num_objective', 0)} objective, "
                f"{record.get('num_constraint', 0)} constraint, {record.get('num_skipped', 0)} skipped)")
        if isinstance(record.get("wall_time"), (int, float)):
            what += f" in {format_duration(record['wall_time'])}"
    health = record.get("health") or {}
    verdict = str(health.get("verdict", "not measured")).upper()
    files = [result_path] + [os.path.join(save_dir, n) for n in ("monitor.jsonl",)
                             if os.path.exists(os.path.join(save_dir, n))]
    return f"gradinit: summary: {what}; health: {verdict}; files: {', '.join(files)}"


def summarize_at_exit(result_path: str, save_dir: str) -> None:
    """Log :func:`summary_line` when the process ends (once per file)."""
    key = os.path.abspath(result_path)
    if key in _SUMMARIES:
        return
    _SUMMARIES.add(key)

    def emit() -> None:
        line = summary_line(result_path, save_dir)
        if line is not None:
            logging.raiseExceptions = False  # a stream closed by the host program must not print a traceback
            logger.info(line)

    atexit.register(emit)


_SUMMARIES: set = set()


def quiet_fairseq_printouts() -> None:
    """Move fairseq-train's printouts of its whole configuration and of the model to the debug level;
    with ``FAIRSEQ_GRADINIT_LOG_LEVEL=debug``, this package's and fairseq's loggers log at debug."""
    quiet_printouts()
