"""Running the study's subprocesses, up to ``parallel`` at once, within a wall-time budget."""
from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .plan import PACKAGE_DIR, REPO_ROOT, StudyConfig

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# running subprocesses within a budget
# ------------------------------------------------------------------------------------------------
@dataclass
class Job:
    name: str
    kind: str                                 # "phase", "arm" or "bleu"
    cmd: List[str]
    log: Path
    deps: Tuple[str, ...] = ()
    stop_time: bool = False                   # append --stop-time-hours from the budget at launch
    on_success: Optional[Callable[["Job"], None]] = None
    status: str = "pending"                   # pending/running/done/failed/killed/skipped
    reason: str = ""
    returncode: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    stop_time_hours: Optional[float] = None
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)
    #: where a log that is written to a temporary place stays afterwards (said when the job starts)
    kept_at: str = ""

    def summary(self, t0: float) -> dict:
        return {"status": self.status, "reason": self.reason, "returncode": self.returncode,
                "start_s": None if self.started is None else round(self.started - t0, 1),
                "wall_s": None if self.started is None or self.ended is None else round(self.ended - self.started, 1),
                "stop_time_hours": self.stop_time_hours, "log": str(self.log)}


def _kill(job: Job, grace_s: float = 10.0) -> None:
    """SIGTERM to the job's process group (it was started in its own session), SIGKILL after a grace."""
    proc = job.proc
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_jobs(jobs: Sequence[Job], *, parallel: int, deadline: Optional[float] = None,
             finish_margin_s: float = 0.0, env: Optional[Mapping[str, str]] = None,
             poll_s: float = 0.5, cwd: Optional[Path] = None) -> None:
    """Run ``jobs`` (in list order, at most ``parallel`` at once, each after its ``deps`` succeeded)
    until all ended or ``deadline`` (``time.time()`` seconds) passed; then the running ones are
    killed and the pending ones skipped. Statuses are written into the jobs."""
    by_name = {j.name: j for j in jobs}
    running: List[Job] = []
    try:
        while True:
            for job in list(running):
                rc = job.proc.poll()
                if rc is None:
                    continue
                running.remove(job)
                job.ended, job.returncode = time.time(), rc
                job.status = "done" if rc == 0 else "failed"
                if rc != 0:
                    job.reason = f"exit code {rc} (see {job.log})"
                elif job.on_success is not None:
                    try:
                        job.on_success(job)
                    except Exception as e:  # a phase that wrote no scales: its arms cannot start
                        job.status, job.reason = "failed", str(e)
            now = time.time()
            if deadline is not None and now >= deadline:
                for job in running:
                    _kill(job)
                    job.ended, job.returncode = time.time(), job.proc.returncode
                    job.status, job.reason = "killed", "still running when the time budget was spent"
                running.clear()
                for job in jobs:
                    if job.status == "pending":
                        job.status, job.reason = "skipped", "the time budget was spent before it could start"
                return
            for job in jobs:
                if job.status != "pending":
                    continue
                dep_status = [by_name[d].status for d in job.deps]
                if any(s in ("failed", "killed", "skipped") for s in dep_status):
                    bad = [d for d in job.deps if by_name[d].status in ("failed", "killed", "skipped")]
                    job.status, job.reason = "skipped", f"{', '.join(bad)} did not succeed"
                    continue
                if len(running) >= parallel or any(s != "done" for s in dep_status):
                    continue
                cmd = list(job.cmd)
                if job.stop_time and deadline is not None:
                    left = deadline - now - finish_margin_s
                    if left <= 0:
                        job.status, job.reason = "skipped", "too little of the time budget left to start"
                        continue
                    job.stop_time_hours = round(left / 3600.0, 6)
                    cmd += ["--stop-time-hours", f"{job.stop_time_hours:.6f}"]
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "w", encoding="utf-8") as log:
                    log.write("# " + shlex.join(cmd) + "\n")
                    log.flush()
                    job.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env or os.environ),
                                                cwd=str(cwd) if cwd else None, start_new_session=True)
                job.started, job.status = time.time(), "running"
                running.append(job)
                logger.info("study: started %s %s (log %s%s)", job.kind, job.name, job.log,
                            f"; {job.kept_at}" if job.kept_at else "")
            if not running and all(j.status != "pending" for j in jobs):
                return
            time.sleep(poll_s)
    except BaseException:
        for job in running:  # interrupted: leave nothing behind
            _kill(job, grace_s=2.0)
            job.status, job.reason = "killed", "the study was interrupted"
        raise


def subprocess_env(cfg: StudyConfig) -> Dict[str, str]:
    env = dict(os.environ)
    # The subprocesses (python -m ...) import the same copies of the library and the lab as this process.
    first = list(dict.fromkeys([str(PACKAGE_DIR.parent), str(REPO_ROOT)]))
    env["PYTHONPATH"] = os.pathsep.join(first + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The jobs run in the caller's folder (its relative paths mean what they meant to the caller);
    # this keeps `python -m` from importing a package of that folder instead of this one.
    env["PYTHONSAFEPATH"] = "1"
    if cfg.cpu and "OMP_NUM_THREADS" not in env:
        # arms at once on the CPU share its cores instead of each taking all of them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.parallel))
    return env
