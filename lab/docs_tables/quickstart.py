"""docs/fairseq.md's timings of the quick start's three steps, from the stored runs (lab/record/quickstart-translation*/:
the steps' wall times in ``times.txt``, step 2's log and its ``gradinit.json``)."""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from .records import RECORD

IDLE = RECORD / "quickstart-translation-idle"
LOADED = RECORD / "quickstart-translation"


def log_span_s(record: Path) -> float:
    """Seconds from the first to the last time-stamped line of the run's ``train.log``."""
    stamps = [datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
              for line in (record / "train.log").read_text(encoding="utf-8").splitlines() if line[:2] == "20"]
    return (stamps[-1] - stamps[0]).total_seconds()


def _phase(record: Path) -> dict:
    return json.loads((record / "gradinit.json").read_text(encoding="utf-8"))


def _link(record: Path, name: str) -> str:
    return f"../lab/record/{record.name}/{name}"


def timings_table() -> str:
    idle, loaded = _phase(IDLE), _phase(LOADED)
    steps = [float(x) for x in re.findall(r"step\d ([\d.]+) s", (IDLE / "times.txt").read_text(encoding="utf-8"))]
    lines = ["| machine and load | version | step 1 | step 2 (its log, of which GradInit) | step 3 | record |",
             "|---|---|---|---|---|---|",
             f"| 2-core VM, otherwise idle | {idle['fingerprint']['version']} | {steps[0]:.0f} s | {steps[1]:.0f} s "
             f"(log {log_span_s(IDLE):.0f} s, GradInit {idle['wall_time']:.0f} s) | {steps[2]:.0f} s "
             f"| [times, log, gradinit.json]({_link(IDLE, 'times.txt')}) |",
             # the loaded run's steps were not timed: only its log and its phase say how long step 2 took
             f"| 2-core VM, other jobs on both cores | {loaded['fingerprint']['version']} | not timed "
             f"| log {log_span_s(LOADED):.0f} s, GradInit {loaded['wall_time']:.0f} s | not timed "
             f"| [log]({_link(LOADED, 'train.log')}), [gradinit.json]({_link(LOADED, 'gradinit.json')}) |"]
    return "\n".join(lines) + "\n"


#: The stored measurement of PyTorch's thread count on a 2-core machine, idle and with one core busy.
THREADS = RECORD.parents[1] / "docs" / "threads-translation.json"


def threads_table(path: Path = THREADS) -> str:
    """docs/fairseq.md's table of the quick start's step 2 with PyTorch's default threads and with one, without and
    with one core busy (seconds of the stored runs)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    seconds = {(r["one_core_busy"], r["setting"]): r["seconds"] for r in data["runs"]}
    lines = [f"| other load | default threads ({data['cpu_count']}) | `OMP_NUM_THREADS=1` |", "|---|---|---|"]
    for busy, label in ((False, "no extra load"), (True, "one core busy")):
        lines.append(f"| {label} | {seconds[(busy, 'default threads')]:.1f} s | "
                     f"{seconds[(busy, 'OMP_NUM_THREADS=1')]:.1f} s |")
    return "\n".join(lines) + "\n"
